"""The task table (``table.TASKS``): what each task loads, feeds and compares, with its run.py fragment
under ``templates/tasks/``. ``task.Task`` is the default row; a new task is one module and one row.
"""
