"""The pytest face: options, the session's setup on the controller (``controller``, ``resolve``), the
catalog as items (``items``, ``suite``), the public fixtures and what they hand a test (``fixtures``,
``handles``, ``evidence``), rows out of reports (``reporting``), progress lines, the scheduler, sharding
and what a failed verdict prints (``explain``). Every stash key lives in ``keys``.
"""
