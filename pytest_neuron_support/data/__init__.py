"""The data a sweep leaves: the row schema (``records``) that drives Parquet, the dataset card and the
viewer; the Parquet dataset itself (``dataset``); failure signatures (``signatures``); the Hub client
(``hub``: cache lookups, the safetensors headers the planner counts, the rankings the viewer shows).
"""
