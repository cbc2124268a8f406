"""Checks the tally the root conftest.py wrote for .ci/run: every collected test ran (one outcome
each), every skip is on .ci/allowed-skips, and no test ended xfailed unless that file lists it too.
Prints the counts and each skip with its reason.

An xfailed project test did not run to a pass: its body failed, and the xfail mark turned that into
a green outcome. The project marks none of its own tests xfail (an expected outcome of a model is
tested through the sessions the tests start, whose outcomes are asserted, not tallied), so one here
is a mark left behind or a test that now fails: it fails the run like a skip not allowed.

Usage: python .ci/tally.py TALLY.json .ci/allowed-skips   (exit 1 on a mismatch)
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from fnmatch import fnmatchcase
from pathlib import Path


def allowed(path: Path) -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text(encoding="utf-8").splitlines())
    return [line.split()[0] for line in lines if line]


def main(tally_path: str, allow_path: str) -> int:
    tally = json.loads(Path(tally_path).read_text(encoding="utf-8"))
    collected, outcomes, skips = tally["collected"], tally["outcomes"], tally["skips"]
    patterns = allowed(Path(allow_path))
    counts = Counter(outcome for outcome in outcomes.values() if outcome != "xfailed")
    summary = ", ".join(f"{n} {what}" for what, n in sorted(counts.items()))
    xfailed = sorted(nodeid for nodeid, outcome in outcomes.items() if outcome == "xfailed")
    also = f", {len(xfailed)} xfailed (not counted as ran)" if xfailed else ""
    print(f".ci/tally: collected {len(collected)}, ran {sum(counts.values())} ({summary or 'nothing'}){also}")
    problems = []
    unran = [nodeid for nodeid in collected if nodeid not in outcomes]
    if not collected:
        problems.append("no test was collected")
    if unran:
        problems.append(f"{len(unran)} collected but never ran: " + ", ".join(unran[:20]))
    for nodeid, reason in sorted(skips.items()):
        ok = any(fnmatchcase(nodeid, pattern) for pattern in patterns)
        print(f".ci/tally: skipped{'' if ok else ' (NOT ALLOWED)'}: {nodeid}: {reason}")
        if not ok:
            problems.append(f"{nodeid} skipped and is not on {allow_path}")
    for nodeid in xfailed:
        ok = any(fnmatchcase(nodeid, pattern) for pattern in patterns)
        print(f".ci/tally: xfailed{'' if ok else ' (NOT ALLOWED)'}: {nodeid}")
        if not ok:
            problems.append(f"{nodeid} ended xfailed (its body failed) and is not on {allow_path}")
    for problem in problems:
        print(f".ci/tally: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
