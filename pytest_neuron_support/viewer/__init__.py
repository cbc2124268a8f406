"""The static results viewer and how to rerun any row (``report``)."""
