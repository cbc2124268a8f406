"""What the warm starts save a sweep, side by side in one run: ``--cpu-side-starts=warm`` against
``fresh``.

With ``warm`` (the default, on Linux) each xdist worker imports torch and transformers once, in a server
(``run/forkserver.py``), and starts every CPU-side script (the reference, the teacher-forced check, the judge) as a
fork of it, and every one-rank device run on the cpu device as a fork of the same server (on the cpu device the two
sides' environments are one, holding the device table's inductor variables; it imports what a first compile imports
before its first compiling run); with ``fresh`` each is a new ``python`` process. The same sweep of tiny-zoo
generation models runs once each way, ``-n 2``, with the cpu row's own backend (inductor;
``--compile-backend=eager`` to leave the compiler out), each with an inductor cache of its own that starts empty
(both compile cold, as on a fresh CI machine; inductor keeps its precompiled headers under
``<tmp>/torchinductor_<user>`` whatever the cache folder, so on a machine that has none the first session, fresh,
builds them), and no reference cache (every reference runs). Prints each session's wall seconds and the CPU seconds
of it and its children, whether both gave the same rows (result and tokens), then warm's CPU and wall over fresh's.

What it answers: how much of a sweep's cost is starting Python, that is, what the warm starts give the
main job's 9-minute and ``.ci/run``'s 20-minute targets. The figures go to
benchmarks/results/ci-timings.md.

    python benchmarks/warm_starts.py [--models qwen3,llama,smollm3,qwen2,mistral] [--compile-backend eager]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _common import catalog, children_cpu, sweep, zoo_cache

STARTS = ("fresh", "warm")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models",
        default="qwen3,llama,smollm3,qwen2,mistral",
        help="tiny-zoo generation architectures (mistral runs on 2 cores: its check and judge are CPU-side)",
    )
    parser.add_argument("--compile-backend", default="inductor", help="the cpu row's backend, or eager")
    args = parser.parse_args()
    entries = [(f"tiny-random/{name}", 2 if name == "mistral" else 1) for name in args.models.split(",")]
    zoo_cache()  # built (or checked) before the clock: its builders are children too
    figures: dict[str, tuple[float, float]] = {}
    rows: dict[str, dict[str, tuple[str, list[int]]]] = {}
    with tempfile.TemporaryDirectory(prefix="warm-starts-") as tmp:
        models = catalog(Path(tmp) / "models.yaml", entries)
        for starts in STARTS:
            before = children_cpu()
            wall, df = sweep(
                Path(tmp),
                models,
                Path(tmp) / starts,
                "-n",
                "2",
                "--neuron-cores=2",
                "--reference-cache=none",
                f"--compile-backend={args.compile_backend}",
                f"--cpu-side-starts={starts}",
                env={"TORCHINDUCTOR_CACHE_DIR": str(Path(tmp) / f"inductor-{starts}")},
            )
            cpu = children_cpu() - before
            rows[starts] = {row.model_id: (row.result, list(row.tokens)) for row in df.itertuples()}
            figures[starts] = (wall, cpu)
            print(f"{starts:>5}: session {wall:.1f} s, {cpu:.1f} CPU-s, results {sorted(df.result)}")
    same = rows["warm"] == rows["fresh"]
    print(f"same results and tokens both ways: {same}")
    (warm_wall, warm_cpu), (fresh_wall, fresh_cpu) = figures["warm"], figures["fresh"]
    print(f"warm / fresh: CPU {warm_cpu / fresh_cpu:.2f}, wall {warm_wall / fresh_wall:.2f}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
