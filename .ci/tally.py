"""Checks the tally the root conftest.py wrote for .ci/run: every collected test ran (one outcome
each) and every skip is on .ci/allowed-skips. Prints the counts and each skip with its reason.

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
    counts = Counter(outcomes.values())
    summary = ", ".join(f"{n} {what}" for what, n in sorted(counts.items()))
    print(f".ci/tally: collected {len(collected)}, ran {len(outcomes)} ({summary or 'nothing'})")
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
    for problem in problems:
        print(f".ci/tally: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
