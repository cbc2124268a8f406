"""Where the test suite's CPU goes: the per-test lines ``tests/cpuclock.py`` writes, summed by test file.

    NEURON_SUPPORT_TEST_CPU=/tmp/suite-cpu.jsonl pytest tests -n 2
    python benchmarks/suite_cpu.py /tmp/suite-cpu.jsonl [--top 20]

Prints the total (and what it means on two CPUs), then the test files by CPU seconds with their share,
then the single most expensive tests. CPU, not wall: see tests/cpuclock.py.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("lines", type=Path, help="the file NEURON_SUPPORT_TEST_CPU named")
    parser.add_argument("--top", type=int, default=20, help="how many files and tests to list (default 20)")
    args = parser.parse_args()
    tests = [json.loads(line) for line in args.lines.read_text(encoding="utf-8").splitlines() if line.strip()]
    cpu = {test["id"]: test["self"] + test["children"] for test in tests}
    by_file: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    for test_id, seconds in cpu.items():
        by_file[test_id.split("::")[0]] += seconds
        counts[test_id.split("::")[0]] += 1
    total = sum(cpu.values())
    print(f"{len(tests)} tests, {total:.0f} CPU-s in all: {total / 2 / 60:.1f} min on two busy CPUs")
    print(f"\n{'CPU-s':>7} {'share':>6} {'tests':>5}  file")
    for name, seconds in by_file.most_common(args.top):
        print(f"{seconds:7.0f} {seconds / total:6.1%} {counts[name]:5d}  {name}")
    print(f"\n{'CPU-s':>7} {'wall s':>7}  test")
    for test in sorted(tests, key=lambda t: -cpu[t["id"]])[: args.top]:
        print(f"{cpu[test['id']]:7.0f} {test['wall']:7.0f}  {test['id']}")


if __name__ == "__main__":
    main()
