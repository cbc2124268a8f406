"""What the caches buy: a cold sweep, then the same sweep warm (compile cache and CPU reference
cache filled by the first), side by side in one run. Also the harness overhead of the warm run:
(item wall - run.py wall - reference wall) / item wall, from pytest's own JUnit durations.

    python benchmarks/rerun.py
Targets: warm rerun >= 3x faster; harness overhead <= 5 %.
"""

from __future__ import annotations

import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from _common import catalog, sweep

ITEMS = [("tiny-random/qwen3", 1), ("tiny-random/llama", 1), ("tiny-random/gemma3_text", 1), ("tiny-random/phi3", 1)]


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        models = catalog(work / "models.yaml", ITEMS)
        caches = ["--neff-cache", str(work / "compile-cache"), "--reference-cache", str(work / "reference-cache")]
        cold_wall, cold = sweep(work, models, work / "cold", *caches)
        junit = work / "warm.xml"
        warm_wall, warm = sweep(work, models, work / "warm", *caches, f"--junitxml={junit}")
        items = {case.get("name"): float(case.get("time", 0)) for case in ET.parse(junit).iter("testcase")}
    print(
        f"cold: {cold_wall:.1f}s  (compile cache hits {int(cold.persistent_cache_hits.sum())}, "
        f"references cached {int(cold.reference_cached.sum())})"
    )
    print(
        f"warm: {warm_wall:.1f}s  (compile cache hits {int(warm.persistent_cache_hits.sum())}, "
        f"references cached {int(warm.reference_cached.sum())})"
    )
    for name, df in (("cold", cold), ("warm", warm)):
        print(
            f"{name} seconds summed over items: run.py {df.run_s.sum():.1f} (load {df.load_s.sum():.1f}, "
            f"compile {df.compile_s.sum():.1f}), reference {df.reference_s.fillna(0).sum():.1f}"
        )
    print(f"warm rerun speed-up = {cold_wall / warm_wall:.2f}x  (target >= 3x)")
    item_wall = sum(items.values())
    inner = float((warm.run_s + warm.reference_s.fillna(0)).sum())
    print(
        f"harness overhead = ({item_wall:.1f} - {inner:.1f}) / {item_wall:.1f} = "
        f"{(item_wall - inner) / item_wall:.1%}  (target <= 5 %)"
    )


if __name__ == "__main__":
    main()
