"""The compile-readiness census: every architecture of every task row whose registry it can feed (text
generation, encoder-decoder generation and each forward task with a registry of its own: classification,
fill-mask, image features, detection, segmentation, depth, audio, CTC; docs/census.md lists the rows it leaves
out and why), as a tiny random model, through the same run.py on CPU: the compiled
static-cache ``generate()`` of a causal LM or an encoder-decoder, the compiled forward pass of the others.

Whether an architecture's decoding step traces into one static graph, breaks the graph, recompiles
every step or falls back to eager is decided by Dynamo and transformers' modeling code before any
backend sees a graph, so it is the same on Neuron as on CPU; on trn2 each graph is a neuronx-cc
compile of minutes to hours. The census measures it for every architecture at the cost of a laptop.

    python benchmarks/census.py                  # every architecture of every task the installed transformers maps
    python benchmarks/census.py --sample         # CI's fixed sample (tests/test_census.py): one or more per task family
    python benchmarks/census.py --resume         # continue an interrupted census where it stopped
    python benchmarks/census.py --task fill-mask --task image-classification
    python benchmarks/census.py --only llama,gpt2                 # of text generation (or of each --task)

Steps: (1) ``pytest_neuron_support.zoo.census`` builds each architecture of each task from its own config
class, shrunk, into a Hub cache (``census/<model_type>`` for text generation, ``census-<task>/<model_type>``
for the others, each with its architecture's own preprocessor), reusing what an earlier run built; (2) one
catalog of the built ones (top-level ``source: census``, each entry its task) is swept by the plugin
(``pytest --device=cpu``, progress lines and ``--resume`` as in any sweep): each row records graphs, graph
breaks and their reasons, recompiles, the recompile-limit hit and its check's verdict (the teacher-forced
check of a causal LM; the calibrated output comparison of a forward task); (3) ``census.md`` counts each task
and tabulates the rows with what could not be built and why, and ``builds.json`` keeps the builder's outcomes.
The rows are a dataset like any other (``<results>/data``): ``neuron-support report`` shows them in the viewer's
Architectures view.

The sweep compiles with ``torch.compile``'s ``eager`` backend by default: Dynamo still captures, counts
and guards every graph (what the census measures), and inductor's code generation (about 24 s of CPU
per graph on a 2-CPU machine) is skipped. ``--backend inductor`` runs the CPU device's own backend.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from pytest_neuron_support.base.storage import write_atomic
from pytest_neuron_support.data.dataset import latest_rows, read_dataset
from pytest_neuron_support.data.records import Row
from pytest_neuron_support.zoo.census import (
    TEXT_GENERATION,
    CensusBuild,
    build_census,
    census_architectures,
    census_tasks,
)

REPO = Path(__file__).resolve().parent.parent

#: CI's fixed sample, by task: a dense Llama-style decoder, GPT-2's learned positions, a sparse MoE, Gemma 3's
#: hybrid sliding-window attention (it recompiles: transformers #44609) and a state-space model; T5's
#: encoder-decoder; then one architecture of each forward task family: text (BERT's sequence classifier), vision
#: (ViT's image classifier) and audio (wav2vec2's CTC head).
SAMPLE: dict[str, tuple[str, ...]] = {
    TEXT_GENERATION: ("gemma3_text", "gpt2", "llama", "mamba", "qwen3_moe"),
    "text2text-generation": ("t5",),
    "text-classification": ("bert",),
    "image-classification": ("vit",),
    "automatic-speech-recognition-ctc": ("wav2vec2",),
}


def default_cache() -> Path:
    import transformers

    base = Path(os.environ.get("NEURON_SUPPORT_ZOO_HOME", Path.home() / ".cache" / "neuron-support"))
    return base / f"census-transformers-{transformers.__version__}" / "hub"


def census_catalog(path: Path, builds: Sequence[CensusBuild]) -> Path:
    """The sweep's catalog: one entry of its task per built architecture, its rows marked census."""
    lines = [
        "# Written by benchmarks/census.py: one tiny random model per architecture and task (not a Selected list).",
        "source: census",
        "models:",
    ]
    for build in builds:
        if build.repo_id is not None:
            lines.append(f"  - {{id: {build.repo_id}, task: {build.task}, tags: [{build.model_type}, census]}}")
    write_atomic(path, "\n".join(lines) + "\n")
    return path


def sweep(catalog: Path, results: Path, cache: Path, args: argparse.Namespace) -> int:
    """The plugin's sweep of the census catalog, its progress lines on this terminal; pytest's exit code."""
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        "--device=cpu",
        f"--models-file={catalog}",
        f"--results-dir={results}",
        f"--compile-backend={args.backend}",
        f"--model-timeout={args.model_timeout}",
        f"--max-new-tokens={args.max_new_tokens}",
        "-n",
        str(args.workers),
        "-rN",  # no -q: the plugin's start / end progress lines are the census's progress
    ]
    if args.resume:
        command.append("--resume")
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    # pytest runs from the results folder: its rootdir and conftest lookup must not be this repository's.
    return subprocess.run(command, cwd=results, env=env, check=False).returncode


def teacher_forced(row: Row) -> str:
    """The teacher-forced CPU check's word for a row: agrees, N disagree, or why it did not run."""
    if row.positions_disagreeing is None:
        return row.cpu_check or "not run"
    if row.positions_disagreeing == 0:
        return f"agrees ({row.positions_checked})"
    return f"{row.positions_disagreeing} of {row.positions_checked} disagree"


def one_graph(row: Row) -> bool:
    """Compiled into exactly one graph (a decoding step's, or a forward task's forward pass): no break, no
    recompile, no recompile-limit hit."""
    return row.graphs_compiled == 1 and not row.graph_breaks and not row.recompiles and row.recompile_limit is None


def table(rows: Sequence[Row], builds: Sequence[CensusBuild]) -> str:
    """census.md: the count per task, each task's architecture table, and what could not be built and why."""
    import transformers

    # One census row per architecture and task: its newest.
    newest = latest_rows((r for r in rows if r.source == "census"), key=lambda r: r.model_id)
    tasks = list(dict.fromkeys(b.task for b in builds))
    swept_of = {t: sorted((r for r in newest.values() if r.task == t), key=lambda r: r.model_id) for t in tasks}
    failed = [b for b in builds if b.repo_id is None]
    lines = [
        f"# Compile-readiness census: transformers {transformers.__version__}",
        "",
        f"{len(builds)} architectures of {len(tasks)} tasks; {len(builds) - len(failed)} built as tiny random models, "
        f"{sum(len(v) for v in swept_of.values())} swept through run.py on CPU; "
        f"**{sum(1 for v in swept_of.values() for r in v if one_graph(r))} compile to exactly one graph**.",
        "",
        "Graphs: compiled by the first run (one decoding step's graph for a causal LM's `generate()`, the forward "
        "pass's for the other tasks: what static shapes need); recompiles: compiled again by the warm second run; "
        "recompile limit: the guard Dynamo gave up on; teacher-forced: the compiled run's tokens scored against the "
        "eager CPU model under the same prefix; verdict basis: the evidence that decided the row.",
        "",
        "| task | architectures | built | swept | one graph | graph breaks | recompile limit | PASS | FAIL | ERROR |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for task in tasks:
        of_task = [b for b in builds if b.task == task]
        swept = swept_of[task]
        results = [r.result for r in swept]
        lines.append(
            f"| {task} | {len(of_task)} | {sum(1 for b in of_task if b.repo_id)} | {len(swept)} | "
            f"{sum(1 for r in swept if one_graph(r))} | {sum(1 for r in swept if r.graph_breaks)} | "
            f"{sum(1 for r in swept if r.recompile_limit is not None)} | {results.count('PASS')} | "
            f"{results.count('FAIL')} | {results.count('ERROR')} |"
        )
    for task in tasks:
        lines += ["", *_task_section(task, swept_of[task], [b for b in builds if b.task == task])]
    if failed:
        lines += ["", f"## Not built ({len(failed)})", "", "| task | architecture | step | why |", "|---|---|---|---|"]
        lines += [f"| {b.task} | {b.model_type} | {b.step} | {_escape(b.error or '')} |" for b in failed]
    return "\n".join(lines) + "\n"


def _task_section(task: str, swept: Sequence[Row], builds: Sequence[CensusBuild]) -> list[str]:
    """One task's part of census.md: its counts in a sentence, then one line per architecture swept."""
    generates = census_tasks()[task].generates
    single = [r for r in swept if one_graph(r)]
    limited = [r for r in swept if r.recompile_limit is not None]
    broken = [r for r in swept if r.graph_breaks]
    graph = "decoding graph" if generates else "forward graph"
    lines = [
        f"## {task}",
        "",
        f"{len(builds)} architectures; {sum(1 for b in builds if b.repo_id)} built, {len(swept)} swept; "
        f"**{len(single)} compile to exactly one {graph}**; {len(broken)} break the graph; "
        f"{len(limited)} hit Dynamo's recompile limit (later steps ran eager).",
        "",
        "| architecture | result | graphs | breaks | recompiles | recompile limit | "
        + ("teacher-forced | " if generates else "")
        + "verdict basis | error |",
        "|---|---|---|---|---|---|" + ("---|" if generates else "") + "---|---|",
    ]
    for row in swept:
        name = row.model_id.split("/", 1)[1]
        # Each reason's headline (Dynamo's message goes on with its explanation and hints), each kind once.
        reasons = "; ".join(dict.fromkeys(r.strip().split("\n", 1)[0] for r in row.graph_break_reasons))
        breaks = f"{row.graph_breaks}" + (f" ({reasons})" if reasons else "") if row.graph_breaks else "0"
        result = row.result + (f" at {row.failure_stage}" if row.failure_stage else "")
        forced = f"{teacher_forced(row)} | " if generates else ""
        lines.append(
            f"| {name} | {result} | {_cell(row.graphs_compiled)} | {_escape(breaks)} | {_cell(row.recompiles)} | "
            f"{_escape(limit_guard(row.recompile_limit))} | {forced}{_escape(row.verdict_basis or '')} | "
            f"{_escape(first_line(row.error) if row.result == 'ERROR' else '')} |"
        )
    return lines


def first_line(error: str | None, limit: int = 140) -> str:
    """An error's first line, cut to ``limit`` characters."""
    line = (error or "").strip().split("\n", 1)[0]
    return line if len(line) <= limit else line[: limit - 1] + "…"


def limit_guard(recompile_limit: str | None) -> str:
    """The guard that kept failing when Dynamo gave up (the row keeps Dynamo's whole message)."""
    if not recompile_limit:
        return ""
    last = recompile_limit.split("last reason: ", 1)[-1]
    return "hit: " + last.split("  #", 1)[0].strip()


def _cell(value: object) -> str:
    return "" if value is None else str(value)


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument("--sample", action="store_true", help="only CI's fixed sample (SAMPLE)")
    chosen.add_argument("--only", help="comma-separated model_types (of each task)")
    parser.add_argument(
        "--task",
        action="append",
        choices=list(census_tasks()),
        help="only this task (repeatable; default: every task the census has)",
    )
    parser.add_argument("--results-dir", type=Path, default=REPO / "benchmarks" / "results" / "census")
    parser.add_argument("--cache-dir", type=Path, default=None, help="the census models' hub cache")
    parser.add_argument("--resume", action="store_true", help="skip architectures that already have a row")
    parser.add_argument("-n", "--workers", type=int, default=2, help="pytest-xdist workers (default 2)")
    parser.add_argument("--backend", default="eager", help="torch.compile backend (default eager; see above)")
    parser.add_argument("--model-timeout", default="600", help="seconds per architecture (default 600)")
    parser.add_argument("--max-new-tokens", default="16", help="greedy tokens per run (default 16)")
    args = parser.parse_args(argv)

    tasks = args.task or (list(SAMPLE) if args.sample else list(census_tasks()))
    if args.only is not None and not args.only.strip(","):
        parser.error("--only: no model_type given (comma-separated model_types, e.g. --only llama,gpt2)")
    if args.only and not args.task:
        tasks = [TEXT_GENERATION]
    if args.sample and set(tasks) - set(SAMPLE):
        parser.error(
            f"--sample --task {', '.join(sorted(set(tasks) - set(SAMPLE)))}: CI's sample has no architecture of "
            f"it (the sample's tasks: {', '.join(SAMPLE)}); use --only with --task instead"
        )
    wanted = {
        task: list(SAMPLE.get(task, ()))
        if args.sample
        else [t for t in args.only.split(",") if t]
        if args.only
        else list(census_architectures(task))
        for task in tasks
    }
    cache = args.cache_dir or default_cache()
    results = args.results_dir.resolve()
    results.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()

    def said(build: CensusBuild) -> None:
        state = (
            f"built ({build.parameters:,} parameters)" if build.repo_id else f"not built at {build.step}: {build.error}"
        )
        where = "" if build.task == TEXT_GENERATION else f" ({build.task})"
        print(f"[census] {build.model_type}{where}: {state}", flush=True)

    total = sum(len(v) for v in wanted.values())
    print(f"[census] building {total} architecture(s) of {len(wanted)} task(s) into {cache}", flush=True)
    builds = [b for task, types in wanted.items() for b in build_census(cache, types, task=task, progress=said)]
    write_atomic(results / "builds.json", json.dumps([dataclasses.asdict(b) for b in builds], indent=1) + "\n")
    built = [b for b in builds if b.repo_id is not None]
    print(f"[census] {len(built)} of {len(builds)} built in {time.monotonic() - start:.0f} s; sweeping", flush=True)
    status = sweep(census_catalog(results / "census.yaml", builds), results, cache, args) if built else 0
    rows = read_dataset(results)
    write_atomic(results / "census.md", table(rows, builds))
    print(f"[census] {results / 'census.md'} written after {time.monotonic() - start:.0f} s", flush=True)
    # pytest exits 1 when an architecture FAILs: that is the census's finding, not its failure.
    return 0 if status in (0, 1) else status


if __name__ == "__main__":
    sys.exit(main())
