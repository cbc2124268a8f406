"""The data a sweep leaves: the row schema (``records``) that drives Parquet, the dataset card and the
viewer; the Parquet dataset itself (``dataset``); failure signatures (``signatures``).
"""
