"""``neuron-support doctor``: check, on this host, every assumption the harness makes about its device.

The package, one place per thing:

* ``command.py``: the command (``add_arguments``, ``main``), ``run_doctor`` (the checks in order, N/A
  by the device table, NOT RUN after a failed prerequisite); ``report.py``: the rows, the report
  (``--json``) and the table;
* ``check.py``: what a check is (``Check``: its row and its runner) and the state a run builds up
  (``Doctor``), from which a check starts its scripts; ``runner.py`` runs a script in a session of
  its own under a deadline; ``render.py`` renders a script as runscript renders run.py;
* ``checks/<key>.py``: one check each, its row (``CHECK``) and its runner; ``registry.py`` puts them
  in order;
* ``scripts/<name>.py``: the checks' subprocess scripts, real files that ruff reads, sharing
  ``scripts/harness.py`` and the parts of ``templates/common.py`` they name.

This package imports neither torch nor transformers: only the checks' subprocesses do.
"""
