"""The room below all the others: the model a check is about (``model.ModelSpec``), how the package
writes a file (``storage``) and keeps tokens out of what it writes (``redaction``). It imports nothing
of the package.
"""
