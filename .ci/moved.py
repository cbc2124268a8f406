"""Prints which packages moved between two pip freeze listings (the pins in constraints.txt and what
a venv holds now): one line per package whose version differs, `name: before -> after`.

Usage: python .ci/moved.py constraints.txt NOW.txt   (.ci/upstream runs it after its install)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path


def pins(path: Path) -> dict[str, str]:
    """Each ``name==version`` line, keyed by the normalised name (PEP 503); comments skipped."""
    found = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        name, sep, version = line.split("#", 1)[0].strip().partition("==")
        if sep:
            found[re.sub(r"[-_.]+", "-", name).lower()] = version.split("+", 1)[0]
    return found


def moved(before: dict[str, str], after: dict[str, str]) -> list[str]:
    names = sorted(set(before) | set(after))
    return [
        f"{name}: {before.get(name, 'not pinned')} -> {after.get(name, 'not installed')}"
        for name in names
        if before.get(name) != after.get(name)
    ]


def main(pinned: str, now: str) -> int:
    lines = moved(pins(Path(pinned)), pins(Path(now)))
    print("\n".join(f"  {line}" for line in lines) if lines else "  nothing moved: the pins are the latest releases")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
