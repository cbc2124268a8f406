"""Running a check's scripts: the session's settings (``settings``), the core ledger (``cores``), run.py's
spec and rendering (``runscript`` and ``templates/``), the isolated process and what its end means
(``execution``), the CPU side's warm starts (``forkserver``), one check's job and its environments
(``context``), and the caches (``caches``, ``neffcache``).
"""
