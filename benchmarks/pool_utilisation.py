"""How well the core ledger keeps a small pool busy with mixed 1-, 2- and 4-core items.

A mixed tiny-zoo sweep over a pool of 4 cores with 4 xdist workers, on CPU. Prints
utilisation = busy core-seconds / (pool x wall) and makespan / the lower bound any schedule
must meet, max(total core-seconds / pool, longest item). Targets: >= 0.90 and <= 1.10.
A core is busy while a lease holds it, which is the device run only: the CPU reference runs
beside it and the verdict after the lease is released. Also prints each item's lease timeline.

    python benchmarks/pool_utilisation.py [--workers N]   (default 4)
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _common import catalog, sweep

POOL = 4
ITEMS = [
    ("tiny-random/olmo2", 4),
    ("tiny-random/mistral", 2),
    ("tiny-random/qwen3_moe", 2),
    ("tiny-random/qwen3", 1),
    ("tiny-random/qwen2", 1),
    ("tiny-random/llama", 1),
    ("tiny-random/gemma3_text", 1),
    ("tiny-random/smollm3", 1),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=POOL, help="xdist workers (-n)")
    workers = parser.parse_args().workers
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        models = catalog(work / "models.yaml", ITEMS)
        _, df = sweep(
            work, models, work / "results", "-n", str(workers), f"--neuron-cores={POOL}", "--reference-cache=none"
        )
    clashes = [
        (a.model_id, b.model_id)
        for i, a in enumerate(df.itertuples())
        for b in list(df.itertuples())[:i]
        if set(range(a.first_core, a.first_core + a.neuron_cores))
        & set(range(b.first_core, b.first_core + b.neuron_cores))
        and a.lease_start < b.lease_end
        and b.lease_start < a.lease_end
    ]
    print(f"double-booked cores: {clashes or 'none'}")
    t0 = float(df.lease_start.min())
    for row in df.sort_values("lease_start").itertuples():
        cores = f"{row.first_core}-{row.first_core + row.neuron_cores - 1}"
        print(f"  {row.model_id:<24} cores {cores:<4} {row.lease_start - t0:7.1f}s .. {row.lease_end - t0:7.1f}s")
    held = df.lease_end - df.lease_start
    busy = float((df.neuron_cores * held).sum())
    makespan = float(df.lease_end.max() - df.lease_start.min())
    lower_bound = max(busy / POOL, float(held.max()))
    print(f"workers: {workers}, pool: {POOL}")
    print(f"items: {len(df)} ({', '.join(f'{c}-core: {int((df.neuron_cores == c).sum())}' for c in (1, 2, 4))})")
    print(f"results: {dict(df.result.value_counts())}")
    print(
        f"utilisation = busy core-seconds / (pool x wall) = {busy:.1f} / ({POOL} x {makespan:.1f}) = "
        f"{busy / (POOL * makespan):.3f}  (target >= 0.90)"
    )
    print(
        f"makespan / lower bound = {makespan:.1f} / {lower_bound:.1f} = {makespan / lower_bound:.3f}  (target <= 1.10)"
    )


if __name__ == "__main__":
    main()
