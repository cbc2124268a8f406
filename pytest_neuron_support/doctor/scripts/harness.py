"""What every doctor check script shares: its SPEC, ``synchronize()``, and ``main(check)``, which runs
the script's ``check()`` and writes the dict it returns (or the exception it raised) to ``argv[1]``.

doctor/render.py splices everything below the @@HARNESS@@ line into each check script, in place of the
script's own ``from harness import ...  # @@HARNESS@@`` line, so each rendered script is standalone
(standard library, torch, transformers) and reruns by hand in the work directory. The
``from common import`` line is replaced in turn by those definitions of templates/common.py (with what
they use of it): a check dies with its parent and writes its result with run.py's own code, not a
copy. What is above the @@HARNESS@@ line is not spliced.
"""

# @@HARNESS@@
import sys
import traceback

from common import end_with_parent, write_json  # @@COMMON@@

SPEC = {}  # @@SPEC@@


def synchronize(torch):
    """Device work is asynchronous: nothing is read before it is done."""
    if SPEC.get("memory_module"):
        getattr(torch, SPEC["memory_module"]).synchronize()


def main(check):
    """Run ``check()`` and write what it returned, or its exception, to ``sys.argv[1]``."""
    end_with_parent()  # a doctor killed outright must not leave a check holding device cores
    try:
        result = check()
    except BaseException as exc:
        result = {"error": f"{type(exc).__name__}: {exc}"[:4000], "traceback": traceback.format_exc()[-6000:]}
    write_json(sys.argv[1], result)
