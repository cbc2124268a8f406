"""What each torch.compile backend costs a CPU sweep with a cold compile cache, side by side in one run.

The main job (README) and the test suite's sessions run on CPU, where a tiny model's device run compiles
its decoding step with the cpu row's backend (``inductor``, ``devices/table.py``). The same sweep of
one-core tiny-zoo models runs once per backend with ``-n 2``, each session with a compile cache of its own
that starts empty (a fresh machine's main job) and no reference cache: ``inductor`` (the table's, with
its C++ wrapper for one-rank runs), ``inductor-per-kernel`` (inductor with the C++ wrapper off,
``TORCHINDUCTOR_CPP_WRAPPER=0``: a translation unit per kernel, each parsing torch's kernel prefix header),
``aot_eager`` (Dynamo and AOT Autograd, the capture and functionalisation every backend gets, no code
generation) and ``eager`` (Dynamo's capture alone). Prints each session's wall seconds, the CPU seconds of
it and its children, the rows' median ``compile_s`` and whether every backend gave the same tokens, then
each backend's CPU over inductor's.

What it answers: how much of a CPU sweep is inductor's code generation, that is, what the cpu row's choice
of backend costs the main job's 9-minute and ``.ci/run``'s 20-minute targets. There is no target to pass:
the figures go to benchmarks/results/suite-cpu.md.

    python benchmarks/cpu_backends.py [--models qwen3,llama,smollm3,qwen2]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _common import catalog, children_cpu, sweep, zoo_cache

BACKENDS = ("inductor", "inductor-per-kernel", "aot_eager", "eager")
#: What a variant changes: its torch.compile backend and the variables its session gets.
VARIANTS = {
    "inductor": ("inductor", {}),
    "inductor-per-kernel": ("inductor", {"TORCHINDUCTOR_CPP_WRAPPER": "0"}),
    "aot_eager": ("aot_eager", {}),
    "eager": ("eager", {}),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="qwen3,llama,smollm3,qwen2", help="tiny-zoo architectures to run")
    args = parser.parse_args()
    entries = [(f"tiny-random/{name}", 1) for name in args.models.split(",")]
    zoo_cache()  # built (or checked) before the clock: its builders are children too
    figures: dict[str, tuple[float, float, float]] = {}
    tokens: dict[str, dict[str, list[int]]] = {}
    with tempfile.TemporaryDirectory(prefix="cpu-backends-") as tmp:
        models = catalog(Path(tmp) / "models.yaml", entries)
        for backend in BACKENDS:
            compile_backend, variables = VARIANTS[backend]
            before = children_cpu()
            wall, df = sweep(
                Path(tmp),
                models,
                Path(tmp) / backend,
                "-n",
                "2",
                "--reference-cache=none",
                f"--compile-backend={compile_backend}",
                f"--neff-cache={Path(tmp) / backend}-compile-cache",
                env=variables,
            )
            cpu = children_cpu() - before
            assert (df.result == "PASS").all(), df[["model_id", "result", "error"]]
            tokens[backend] = {row.model_id: list(row.tokens) for row in df.itertuples()}
            figures[backend] = (wall, cpu, float(df.compile_s.median()))
            print(f"{backend:>19}: session {wall:.1f} s, {cpu:.1f} CPU-s, median compile_s {figures[backend][2]:.1f} s")
    base = figures["inductor"][1]
    for backend in BACKENDS[1:]:
        print(f"CPU ratio {backend} / inductor: {figures[backend][1] / base:.2f}")
    same = all(tokens[backend] == tokens["inductor"] for backend in BACKENDS)
    print(f"same tokens with every backend: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
