"""Planted faults: does the harness reject device runs we broke on purpose, and accept healthy ones?

Each kind of benchmarks/faults.py (a corpus of device-side faults of our own, plus healthy-numerics
stand-ins) is planted, through the plugin's post-load hook, into the DEVICE run.py of every tiny-zoo
generation model it applies to (models-tiny.yaml's text-generation and image-text-to-text entries;
not the embedding entry): one CPU pytest session per kind, whose conftest returns the source of
the kind named by NEURON_SUPPORT_PLANTED_FAULT. The CPU reference never runs it.

Every row is judged by a strict oracle (:func:`judge`): a fault kind counts as caught only as a FAIL
at its stage (``parity``, or ``generate`` for the warm-run kind) with the evidence it plants (its first
teacher-forced disagreement, or the warm run's divergence, at the planted position); a PASS, or a FAIL
elsewhere or without that evidence, is missed. A healthy kind must PASS (else a false FAIL). A row with
no verdict (ERROR, TIMEOUT, no row, SKIPPED or EXCLUDED, or a run.py that does not carry the planted
source) is a broken fault, reported as one and never counted as caught. Prints, per kind: what it is,
whether a correct harness must reject it (fault) or accept it (healthy), the models run, caught /
missed / false FAIL / broken, each row's result@failure_stage summarised, and verdict_basis when the
rows have that column.

    python benchmarks/planted_faults.py [--kinds a,b] [--models id,id] [-n 2] [--keep DIR]

From a checkout whose editable install points elsewhere, put the checkout first:
``PYTHONPATH=$PWD .venv/bin/python benchmarks/planted_faults.py``. The CPU references and the compile
cache persist under --cache-dir (default ~/.cache/neuron-support/planted-faults), so a rerun only
repeats the device runs. Each session imports benchmarks/faults.py afresh: leave it alone while this
runs. Targets: 0 missed, 0 false FAIL, 0 broken; exit status 1 otherwise.
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
from faults import ENV_VAR, FAULT, FAULTS, HEALTHY, Fault, applies, conftest

from pytest_neuron_support.base.storage import slug
from pytest_neuron_support.tasks.table import TASKS

BENCH = Path(__file__).resolve().parent
CATALOG = REPO / "models-tiny.yaml"
# The largest zoo entry (olmo2) takes 4 cores: a pool of 4 runs every entry.
POOL = 4
DEFAULT_CACHE = Path.home() / ".cache" / "neuron-support" / "planted-faults"
#: Results that say nothing about the planted source: the model never ran.
NOT_RUN = ("SKIPPED", "EXCLUDED")


#: What the oracle (:func:`judge`) makes of one row of a fault kind ...
CAUGHT = "caught"  # a FAIL at the kind's stage, with the evidence it plants
MISSED = "missed"  # a PASS, or a FAIL elsewhere or without that evidence: the harness did not catch it
#: ... and of one row of a healthy kind.
ACCEPTED = "accepted"  # a PASS
FALSE_FAIL = "false-fail"  # a FAIL
#: Either kind: the row says nothing about the harness's verdicts. ERROR or TIMEOUT (the planted source,
#: or something around the run, broke it), no row, a row never run (SKIPPED, EXCLUDED), or a run.py
#: that does not carry the planted source. Never counted as caught.
BROKEN = "broken-fault"
#: Results of a run that got a verdict.
VERDICTS = ("PASS", "FAIL")


@dataclass(frozen=True)
class Judgement:
    """The oracle's reading of one model's row under one planted kind: the outcome, and why."""

    model: str
    outcome: str
    why: str


def _missing_evidence(fault: Fault, row: Mapping[str, Any]) -> str | None:
    """What the row lacks of the evidence ``fault`` plants at its stage, or None when it holds it all."""
    if fault.stage == "parity":
        # Every generation row that reaches a parity verdict carries the teacher-forced check's evidence
        # (one-core and sharded alike): the disagreement the fault made must be in it.
        disagreeing, first = _clean(row.get("positions_disagreeing")), _clean(row.get("first_disagreement"))
        if not disagreeing:
            return "the teacher-forced CPU check recorded no disagreeing position"
        if fault.position is not None and first != fault.position:
            return f"the first teacher-forced disagreement is at position {first}, not at the planted {fault.position}"
        return None
    if fault.stage == "generate":
        divergence = _clean(row.get("repeat_divergence"))
        if row.get("verdict_basis") != "repeat" or divergence is None:
            return "no divergence of the warm run from the first is recorded"
        if fault.position is not None and divergence != fault.position:
            return f"the warm run diverges at position {divergence}, not at the planted {fault.position}"
        return None
    raise ValueError(f"fault stage {fault.stage!r} has no evidence rule; use 'parity' or 'generate'")


def judge(fault: Fault, model: str, row: Mapping[str, Any] | None) -> Judgement:
    """The benchmark's oracle: one model's row (None when the session wrote none) under ``fault``.

    A fault kind is caught only as a FAIL at its stage with its evidence (:func:`_missing_evidence`);
    a healthy kind must PASS. Whatever gave no verdict (ERROR, TIMEOUT, no row, not run, the planted
    source absent from run.py) is a broken fault, never a catch."""
    if row is None:
        return Judgement(model, BROKEN, "no row: the session wrote none for this model")
    result, stage, error = row.get("result"), row.get("failure_stage"), row.get("error") or ""
    where = f"{result}@{stage}" if stage else str(result)
    if result not in VERDICTS:
        return Judgement(model, BROKEN, f"{where}, no verdict: {error[:300]}".rstrip(": "))
    if planted_source(row.get("runscript")) != fault.source:
        return Judgement(model, BROKEN, f"{where}, but its run.py does not carry the planted source")
    if fault.expected == HEALTHY:
        if result == "PASS":
            return Judgement(model, ACCEPTED, "PASS")
        return Judgement(model, FALSE_FAIL, f"{where}: {error[:300]}")
    if result == "PASS":
        return Judgement(model, MISSED, "PASS: the harness accepted the planted fault")
    if stage != fault.stage:
        return Judgement(model, MISSED, f"{where}, not at stage {fault.stage}: {error[:300]}")
    missing = _missing_evidence(fault, row)
    if missing is not None:
        return Judgement(model, MISSED, f"{where}, but {missing}")
    evidence = f" at position {fault.position}" if fault.position is not None else ""
    return Judgement(model, CAUGHT, f"{where}{evidence}")


@dataclass
class Outcome:
    """One kind's session, judged row by row."""

    kind: str
    models: list[str]
    wall_s: float = 0.0
    rows: list[dict[str, Any]] = field(default_factory=list)
    judgements: list[Judgement] = field(default_factory=list)

    @property
    def expected(self) -> str:
        return FAULTS[self.kind].expected

    def count(self, outcome: str) -> int:
        return sum(1 for j in self.judgements if j.outcome == outcome)

    def wrong(self) -> list[Judgement]:
        """Every judgement that is not what a correct harness and a working fault give."""
        return [j for j in self.judgements if j.outcome not in (CAUGHT, ACCEPTED)]

    def ok(self) -> bool:
        return not self.wrong() and len(self.judgements) == len(self.models)


def generation_entries(path: Path = CATALOG) -> list[dict[str, Any]]:
    """The catalog's generation entries, as written (cores, task, prompt, tags kept)."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return [entry for entry in data["models"] if TASKS[entry.get("task", "text-generation")].generates]


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
            source = ast.literal_eval(node.value).get("post_load")
            return None if source is None else str(source)
    return None


def run_kind(
    kind: str,
    entries: Sequence[Mapping[str, Any]],
    judge_model: Any,
    work: Path,
    workers: int,
    cache: Path,
    extra_args: Sequence[str] = (),
) -> Outcome:
    """One pytest session with ``kind`` planted into every entry of ``entries`` (``extra_args`` go to
    pytest as they are), each model's row judged by :func:`judge`."""
    fault = FAULTS[kind]
    directory = work / kind
    directory.mkdir(parents=True, exist_ok=True)
    models_file = directory / "models.yaml"
    models_file.write_text(yaml.safe_dump({"judge": judge_model, "models": list(entries)}, sort_keys=False, width=1000))
    (directory / "conftest.py").write_text(conftest(str(BENCH)), encoding="utf-8")
    outcome = Outcome(kind, [entry["id"] for entry in entries])
    args = [
        "-n",
        str(workers),
        f"--neuron-cores={POOL}",
        f"--reference-cache={cache / 'reference'}",
        f"--neff-cache={cache / 'compile'}",
        *extra_args,
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
        if row is not None:
            row.setdefault("repeat_identical", _repeat_identical(directory / "results", model))
            outcome.rows.append(row)
        outcome.judgements.append(judge(fault, model, row))
    return outcome


def _repeat_identical(results: Path, model: str) -> bool | None:
    """Whether run.py's warm generate() gave the first one's tokens, from its result.json: rows only
    carry it on harnesses that have the column (None where the run did not get that far)."""
    try:
        result = json.loads((results / "runs" / slug(model) / "cpu" / "device" / "result.json").read_text())
    except (OSError, ValueError):
        return None
    value = result.get("repeat_identical")
    return None if value is None else bool(value)


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
    tokens = row.get("tokens")
    return list(tokens if tokens is not None else ()) != list(reference)


def report(outcomes: Sequence[Outcome], basis: bool) -> None:
    header = ["kind", "must", "models", "caught", "missed", "false FAIL", "broken", "tokens!=ref", "warm!=cold"]
    header += ["s", "results"]
    if basis:
        header.append("verdict_basis")
    lines = [header]
    for o in outcomes:
        fault = o.expected == FAULT
        changed = [c for c in map(tokens_changed, o.rows) if c is not None]
        repeats = [r["repeat_identical"] for r in o.rows if r.get("repeat_identical") is not None]
        line = [
            o.kind,
            "reject" if fault else "accept",
            str(len(o.models)),
            str(o.count(CAUGHT)) if fault else "-",
            str(o.count(MISSED)) if fault else "-",
            "-" if fault else str(o.count(FALSE_FAIL)),
            str(o.count(BROKEN)),
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
    print("\ncaught: a FAIL at the kind's stage with its evidence (its first teacher-forced disagreement, or the warm")
    print("run's divergence, at the planted position); missed: a PASS, or a FAIL elsewhere or without that evidence;")
    print("broken: no verdict at all (ERROR, TIMEOUT, no row, not run, run.py without the planted source);")
    print("tokens!=ref: rows whose device tokens differ from the clean CPU reference's / rows with a reference;")
    print("warm!=cold: rows whose second (warm) generate() gave other tokens than the first / rows that ran both")
    print("(together: whether the planted source changed what the device decoded). Kinds:")
    for o in outcomes:
        print(f"  {o.kind} ({FAULTS[o.kind].expected}, {FAULTS[o.kind].applies_to}): {FAULTS[o.kind].description}")


def report_misses(outcomes: Sequence[Outcome]) -> None:
    rows = {(o.kind, r["model_id"]): r for o in outcomes for r in o.rows}
    for o in outcomes:
        for judged in o.wrong():
            row = rows.get((o.kind, judged.model)) or {}
            verdicts = f", judge {row['judge_verdict']} {row.get('judge_score')}" if row.get("judge_verdict") else ""
            print(f"  {o.kind}: {judged.model} {judged.outcome}{verdicts}: {judged.why}")


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
    judge_model = judge_of()
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
            outcome = run_kind(kind, targets, judge_model, work, args.workers, args.cache_dir.expanduser())
            print(f"  {kind}: {len(targets)} model(s) in {outcome.wall_s:.0f}s: {summary(map(verdict, outcome.rows))}")
            outcomes.append(outcome)
        print()
        basis = any("verdict_basis" in row for o in outcomes for row in o.rows)
        report(outcomes, basis)
    missed = sum(o.count(MISSED) for o in outcomes)
    false_fail = sum(o.count(FALSE_FAIL) for o in outcomes)
    broken = sum(o.count(BROKEN) for o in outcomes)
    print(f"\nmissed = {missed}  (target 0: a false PASS, or a FAIL without the fault's evidence at its stage)")
    print(f"false FAIL = {false_fail}  (target 0)\nbroken faults = {broken}  (target 0: no verdict, never a catch)")
    if not all(o.ok() for o in outcomes):
        print("misses:")
        report_misses(outcomes)
    if args.keep is not None:
        print(f"\nsessions kept in {args.keep.resolve()}")
    return 0 if all(o.ok() for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
