"""Planted faults: does the harness reject device runs we broke on purpose, and accept healthy ones?

Each kind of benchmarks/faults.py (a corpus of device-side faults of our own, plus healthy-numerics
stand-ins) is planted, through the plugin's post-load hook, into the DEVICE run.py of every tiny-zoo
generation model it applies to (models-tiny.yaml's text-generation and image-text-to-text entries;
not the embedding entry): one CPU pytest session per kind, whose conftest returns the source of
the kind named by NEURON_SUPPORT_PLANTED_FAULT. The CPU reference never runs it. Prints, per kind:
what it is, whether a correct harness must reject it (fault) or accept it (healthy), the models
run, false PASS (a fault kind's row is PASS) and false FAIL (a healthy kind's row is not PASS),
each row's result@failure_stage summarised, and verdict_basis when the rows have that column.
Every row's runscript is checked to carry the planted source, so a fault that never reached the
device cannot pass for a caught one.

    python benchmarks/planted_faults.py [--kinds a,b] [--models id,id] [-n 2] [--keep DIR]

From a checkout whose editable install points elsewhere, put the checkout first:
``PYTHONPATH=$PWD .venv/bin/python benchmarks/planted_faults.py``. The CPU references and the compile
cache persist under --cache-dir (default ~/.cache/neuron-support/planted-faults), so a rerun only
repeats the device runs. Each session imports benchmarks/faults.py afresh: leave it alone while this
runs. Targets: 0 false PASS, 0 false FAIL; exit status 1 when one is missed (or a
row is missing, or its run.py lacks the fault).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import math
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from _common import REPO, sweep, zoo_cache
from faults import ENV_VAR, FAULT, FAULTS, HEALTHY, applies, conftest

from pytest_neuron_support.settings import slug
from pytest_neuron_support.tasks import GENERATION_TASKS

BENCH = Path(__file__).resolve().parent
CATALOG = REPO / "models-tiny.yaml"
# The largest zoo entry (olmo2) takes 4 cores: a pool of 4 runs every entry.
POOL = 4
DEFAULT_CACHE = Path.home() / ".cache" / "neuron-support" / "planted-faults"
#: Results that say nothing about the planted source: the model never ran.
NOT_RUN = ("SKIPPED", "EXCLUDED")


@dataclass
class Outcome:
    """One kind's session, judged."""

    kind: str
    models: list[str]
    wall_s: float = 0.0
    rows: list[dict[str, Any]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # models without a verdict: no row, or SKIPPED/EXCLUDED
    unplanted: list[str] = field(default_factory=list)  # rows whose run.py does not carry the fault

    @property
    def expected(self) -> str:
        return FAULTS[self.kind].expected

    def wrong(self) -> list[dict[str, Any]]:
        """Rows with the wrong verdict: a fault that PASSed, or a healthy run that did not. A row that
        was never run (SKIPPED, EXCLUDED) is no verdict either way: it counts as missing instead."""
        judged = [r for r in self.rows if r["result"] not in NOT_RUN]
        if self.expected == FAULT:
            return [r for r in judged if r["result"] == "PASS"]
        return [r for r in judged if r["result"] != "PASS"]

    def ok(self) -> bool:
        return not self.wrong() and not self.missing and not self.unplanted


def generation_entries(path: Path = CATALOG) -> list[dict[str, Any]]:
    """The catalog's generation entries, as written (cores, task, prompt, tags kept)."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return [entry for entry in data["models"] if entry.get("task", "text-generation") in GENERATION_TASKS]


def judge_of(path: Path = CATALOG) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8")).get("judge")


def chosen(names: str | None, known: Sequence[str], what: str) -> list[str]:
    """The comma-separated subset ``names`` of ``known`` (all of them when None), in ``known``'s order."""
    if names is None:
        return list(known)
    wanted = [name.strip() for name in names.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in known]
    if unknown:
        raise SystemExit(f"unknown {what}: {', '.join(unknown)}; choose from {', '.join(known)}")
    return [name for name in known if name in wanted]


def planted_source(runscript: str | None) -> str | None:
    """SPEC["post_load"] of a stored run.py: what the device run really executed after loading."""
    if not runscript:
        return None
    for node in ast.parse(runscript).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "SPEC" for t in node.targets):
            return ast.literal_eval(node.value).get("post_load")
    return None


def run_kind(
    kind: str, entries: Sequence[Mapping[str, Any]], judge: Any, work: Path, workers: int, cache: Path
) -> Outcome:
    """One pytest session with ``kind`` planted into every entry of ``entries``."""
    fault = FAULTS[kind]
    directory = work / kind
    directory.mkdir(parents=True, exist_ok=True)
    models_file = directory / "models.yaml"
    models_file.write_text(yaml.safe_dump({"judge": judge, "models": list(entries)}, sort_keys=False, width=1000))
    (directory / "conftest.py").write_text(conftest(str(BENCH)), encoding="utf-8")
    outcome = Outcome(kind, [entry["id"] for entry in entries])
    args = [
        "-n",
        str(workers),
        f"--neuron-cores={POOL}",
        f"--reference-cache={cache / 'reference'}",
        f"--neff-cache={cache / 'compile'}",
    ]
    start = time.monotonic()
    try:
        _, df = sweep(
            directory, models_file, directory / "results", *args, env={ENV_VAR: kind}, log=directory / "pytest.log"
        )
    except (OSError, ValueError) as exc:  # no Parquet at all: the session itself broke
        print(f"  {kind}: the session wrote no rows ({type(exc).__name__}: {exc}); see {directory / 'pytest.log'}")
        df = pd.DataFrame()
    outcome.wall_s = time.monotonic() - start
    records = [{key: _clean(value) for key, value in row.items()} for row in df.to_dict("records")]
    rows = {row["model_id"]: row for row in records}
    for model in outcome.models:
        row = rows.get(model)
        if row is None:
            outcome.missing.append(model)
            continue
        row.setdefault("repeat_identical", _repeat_identical(directory / "results", model))
        outcome.rows.append(row)
        if row["result"] in NOT_RUN:
            outcome.missing.append(model)
        # A row that ran (not skipped at plan) must have executed exactly the planted source.
        if row.get("runscript") and planted_source(row["runscript"]) != fault.source:
            outcome.unplanted.append(model)
    return outcome


def _repeat_identical(results: Path, model: str) -> bool | None:
    """Whether run.py's warm generate() gave the first one's tokens, from its result.json: rows only
    carry it on harnesses that have the column (None where the run did not get that far)."""
    try:
        result = json.loads((results / "runs" / slug(model) / "cpu" / "device" / "result.json").read_text())
    except (OSError, ValueError):
        return None
    return result.get("repeat_identical")


def _clean(value: Any) -> Any:
    """pandas' NaN for a missing value of a float (or all-null) column, as None."""
    return None if isinstance(value, float) and math.isnan(value) else value


def summary(values: Iterable[str]) -> str:
    """'FAIL@parity x8, PASS x2': most frequent first."""
    counts = Counter(values)
    return ", ".join(f"{value} x{n}" for value, n in counts.most_common()) or "-"


def verdict(row: Mapping[str, Any]) -> str:
    stage = row.get("failure_stage")
    return f"{row['result']}@{stage}" if stage else row["result"]


def tokens_changed(row: Mapping[str, Any]) -> bool | None:
    """Whether the device tokens differ from the clean CPU reference (None where no reference ran)."""
    reference = row.get("reference_tokens")
    if reference is None or len(reference) == 0:
        return None
    return list(row.get("tokens") if row.get("tokens") is not None else ()) != list(reference)


def report(outcomes: Sequence[Outcome], basis: bool) -> None:
    header = ["kind", "must", "models", "false PASS", "false FAIL", "tokens!=ref", "warm!=cold", "s", "results"]
    if basis:
        header.append("verdict_basis")
    lines = [header]
    for o in outcomes:
        wrong = len(o.wrong())
        changed = [c for c in map(tokens_changed, o.rows) if c is not None]
        repeats = [r["repeat_identical"] for r in o.rows if r.get("repeat_identical") is not None]
        line = [
            o.kind,
            "reject" if o.expected == FAULT else "accept",
            str(len(o.models)),
            str(wrong) if o.expected == FAULT else "-",
            str(wrong) if o.expected == HEALTHY else "-",
            f"{sum(changed)}/{len(changed)}" if changed else "-",
            f"{repeats.count(False)}/{len(repeats)}" if repeats else "-",
            f"{o.wall_s:.0f}",
            summary([verdict(r) for r in o.rows] + ["no row"] * (len(o.models) - len(o.rows))),
        ]
        if basis:
            line.append(summary(str(r.get("verdict_basis")) for r in o.rows))
        lines.append(line)
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    for line in lines:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=False)) + "  " + line[-1])
    print("\ntokens!=ref: rows whose device tokens differ from the clean CPU reference's / rows with a reference;")
    print("warm!=cold: rows whose second (warm) generate() gave other tokens than the first / rows that ran both")
    print("(together: whether the planted source changed what the device decoded). Kinds:")
    for o in outcomes:
        print(f"  {o.kind} ({FAULTS[o.kind].expected}, {FAULTS[o.kind].applies_to}): {FAULTS[o.kind].description}")


def report_misses(outcomes: Sequence[Outcome]) -> None:
    for o in outcomes:
        for row in o.wrong():
            text = (row.get("text") or "")[:90]
            judged = f", judge {row.get('judge_verdict')} {row.get('judge_score')}" if row.get("judge_verdict") else ""
            print(f"  {o.kind}: {row['model_id']} {verdict(row)}{judged}: {row.get('error') or text!r}")
        for model in o.missing:
            print(f"  {o.kind}: {model} has no verdict (no row, or it was not run)")
        for model in o.unplanted:
            print(f"  {o.kind}: {model}'s run.py does not carry the planted source")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default=None, help=f"comma-separated kinds (default all: {', '.join(FAULTS)})")
    parser.add_argument("--models", default=None, help="comma-separated model ids (default every generation entry)")
    parser.add_argument("-n", type=int, default=2, dest="workers", help="xdist workers per session (default 2)")
    parser.add_argument("--keep", type=Path, default=None, help="keep each session's dir (catalog, rows, runs) here")
    parser.add_argument(
        "--cache-dir", type=Path, default=DEFAULT_CACHE, help="CPU reference and compile caches shared by sessions"
    )
    args = parser.parse_args(argv)
    entries = generation_entries()
    kinds = chosen(args.kinds, list(FAULTS), "kinds")
    models = chosen(args.models, [entry["id"] for entry in entries], "models (generation entries of models-tiny.yaml)")
    selected = [entry for entry in entries if entry["id"] in models]
    judge = judge_of()
    print("tiny zoo: building or checking it (minutes on a fresh machine)...", flush=True)
    # Once, before the sessions time themselves; its twelve "already installed" lines say nothing here.
    with contextlib.redirect_stdout(io.StringIO()):
        zoo_cache()
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="planted-faults-") as tmp:
        work = args.keep.resolve() if args.keep is not None else Path(tmp)
        for kind in kinds:
            targets = [entry for entry in selected if applies(FAULTS[kind], entry.get("cores"))]
            if not targets:
                print(f"  {kind}: applies to {FAULTS[kind].applies_to} entries, none selected; not run")
                continue
            outcome = run_kind(kind, targets, judge, work, args.workers, args.cache_dir.expanduser())
            print(f"  {kind}: {len(targets)} model(s) in {outcome.wall_s:.0f}s: {summary(map(verdict, outcome.rows))}")
            outcomes.append(outcome)
        print()
        basis = any("verdict_basis" in row for o in outcomes for row in o.rows)
        report(outcomes, basis)
    false_pass = sum(len(o.wrong()) for o in outcomes if o.expected == FAULT)
    false_fail = sum(len(o.wrong()) for o in outcomes if o.expected == HEALTHY)
    broken = sum(len(o.missing) + len(o.unplanted) for o in outcomes)
    print(f"\nfalse PASS = {false_pass}  (target 0)\nfalse FAIL = {false_fail}  (target 0)")
    if broken:
        print(f"models without a verdict or without the planted source = {broken}  (must be 0)")
    if not all(o.ok() for o in outcomes):
        print("misses:")
        report_misses(outcomes)
    if args.keep is not None:
        print(f"\nsessions kept in {args.keep.resolve()}")
    return 0 if all(o.ok() for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
