"""What sharing the CPUs among a session's runs buys (``--cpu-threads``), side by side in one run.

The same sweep of one-core tiny-zoo models runs twice with ``-n 2`` on CPU: once with
``--cpu-threads=auto`` (the usable CPUs shared among the workers' concurrent runs, at least one
thread each) and once with every run's pool sized to the machine, as torch sizes it by default
(``--cpu-threads=<torch.get_num_threads()>``). Both use the eager compile backend (what is measured
is the runs' CPU work, not inductor's code generation) and no reference cache, so each session runs
every device run and CPU reference itself. Prints, per session, its wall seconds and the rows'
median warm ``generate()`` seconds and decode tokens/s, then the ratios.

Targets: the auto session takes no longer than the machine-sized one (wall ratio <= 1.0), and its
decoding is faster (decode ratio >= 1.0). On a machine with many more CPUs than concurrent runs the
two settings come closer; the gap is widest where runs outnumber the CPUs.

    python benchmarks/cpu_threads.py [--models qwen3,llama,smollm3,qwen2]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _common import catalog, sweep


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="qwen3,llama,smollm3,qwen2", help="tiny-zoo architectures to run")
    args = parser.parse_args()
    import torch

    machine = torch.get_num_threads()
    entries = [(f"tiny-random/{name}", 1) for name in args.models.split(",")]
    figures = {}
    with tempfile.TemporaryDirectory(prefix="cpu-threads-") as tmp:
        models = catalog(Path(tmp) / "models.yaml", entries)
        for label, threads in (("auto", "auto"), ("machine-sized", str(machine))):
            results = Path(tmp) / label
            wall, df = sweep(
                Path(tmp),
                models,
                results,
                "-n",
                "2",
                "--compile-backend=eager",
                "--reference-cache=none",
                f"--cpu-threads={threads}",
            )
            assert (df.result == "PASS").all(), df[["model_id", "result", "error"]]
            figures[label] = (wall, float(df.generate_s.median()), float(df.decode_tokens_per_s.median()))
            print(
                f"{label:>13}: --cpu-threads={threads} (rows: {sorted(set(df.cpu_threads))} thread(s)), "
                f"session {wall:.1f} s, warm generate() median {figures[label][1]:.2f} s, "
                f"decode median {figures[label][2]:.1f} tokens/s"
            )
    auto, sized = figures["auto"], figures["machine-sized"]
    print(f"wall ratio auto / machine-sized: {auto[0] / sized[0]:.2f} (target <= 1.0)")
    print(f"decode ratio auto / machine-sized: {auto[2] / sized[2]:.2f} (target >= 1.0)")
    return 0 if auto[0] <= sized[0] and auto[2] >= sized[2] else 1


if __name__ == "__main__":
    raise SystemExit(main())
