"""The results dataset: one Parquet file per stack, crash-safe parts, and its card.

Layout of ``--results-dir``::

    README.md                       dataset card (YAML front matter declares the configs)
    data/neuronxcc-<v>__transformers-<v>.parquet
    .parts/<session>/<n>.json      rows written as items finish (crash safety)

``pandas.read_parquet("<results-dir>/data")`` loads every stack. Rows are keyed by
(model_id, device, test, check) inside a stack's file: rerunning a model replaces its row and nothing
else. Every write goes to a temporary file and is renamed into place, under a file lock, so
concurrent sessions and shards never lose or tear a row.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from filelock import FileLock

from pytest_neuron_support.base.storage import write_atomic
from pytest_neuron_support.data.records import (
    COLUMN_DOCS,
    COLUMN_TYPES,
    RESULTS,
    STAGES,
    VERDICT_BASES,
    Row,
    arrow_schema,
)
from pytest_neuron_support.data.signatures import BUCKETS, MAX_MESSAGE, RULES, blockers
from pytest_neuron_support.verdict.training import (
    GRAD_NORM_RTOL,
    LOSS_ATOL,
    LOSS_RTOL,
    TRAIN_BATCH,
    TRAIN_LEARNING_RATE,
    TRAIN_MAX_LENGTH,
    TRAIN_SEED,
    TRAIN_STEPS,
)

#: A key rows are grouped by (latest_rows).
K = TypeVar("K")

DATA_DIR = "data"
PARTS_DIR = ".parts"
LOCK_NAME = ".dataset.lock"


def row_key(row: Row) -> tuple[str, str, str, str]:
    # A user's test of a model is a row of its own: it neither replaces nor is replaced by the catalog's;
    # so is each check of a model (its inference and its training row).
    return (row.model_id, row.device, row.test, row.check)


def stack_stem(row: Row) -> str:
    return f"neuronxcc-{row.neuronx_cc}__{row.library}-{row.library_version}"


def read_rows(path: Path) -> list[Row]:
    """Rows of one Parquet file."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    return [Row.from_mapping(record) for record in table.to_pylist()]


def read_dataset(results_dir: Path) -> list[Row]:
    """Every row of every stack file under ``results_dir/data``."""
    data = results_dir / DATA_DIR
    rows: list[Row] = []
    for path in sorted(data.glob("*.parquet")):
        rows.extend(read_rows(path))
    return rows


class NoDataset(FileNotFoundError):
    """A results folder that holds no dataset: read as an empty one, a mistyped path would be a sweep with
    no rows (every model "missing" to ``diff``, an empty viewer), and a gate would pass on it."""


def require_dataset(results_dir: Path) -> list[Row]:
    """Every row under ``results_dir/data``; :class:`NoDataset` when it holds no Parquet file, saying what
    is there instead (no folder, an empty one, a killed sweep's unsaved parts)."""
    data = results_dir / DATA_DIR
    if any(data.glob("*.parquet")):
        return read_dataset(results_dir)
    if not results_dir.exists():
        found = "the folder does not exist"
    elif (results_dir / PARTS_DIR).is_dir():
        found = (
            f"only the unsaved rows of a sweep that did not finish ({PARTS_DIR}/); write them to Parquet with "
            f"neuron-support merge {results_dir} --into {results_dir}"
        )
    else:
        found = f"no {DATA_DIR}/*.parquet in it"
    raise NoDataset(f"{results_dir} holds no dataset: {found}; pass the results folder of a sweep (its --results-dir)")


def near_tie_pass(row: Row) -> bool:
    """A PASS whose tokens parted from the CPU's at a near-tie (the free-running first divergence, or every
    teacher-forced disagreement): numeric drift the verdict let through, read apart from a PASS whose
    tokens all agreed."""
    return row.result == "PASS" and (row.near_tie is True or row.disagreements_near_tie is True)


def _write_table(path: Path, rows: Sequence[Row]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    # A row's fields are flat values and tuples: read them straight off it. dataclasses.asdict
    # deep-copies every value, which was most of the cost of merging a row into a large file.
    names = [f.name for f in dataclasses.fields(Row)]
    table = pa.Table.from_pylist([{name: getattr(r, name) for name in names} for r in rows], schema=arrow_schema())
    write_atomic(path, lambda tmp: pq.write_table(table, tmp))


def write_rows(results_dir: Path, rows: Iterable[Row]) -> list[Path]:
    """Merge ``rows`` into the dataset; return the Parquet files touched."""
    by_stack: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        by_stack[stack_stem(row)].append(row)
    if not by_stack:
        return []
    data = results_dir / DATA_DIR
    data.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    with FileLock(str(results_dir / LOCK_NAME)):
        for stem, new_rows in sorted(by_stack.items()):
            path = data / f"{stem}.parquet"
            merged = {row_key(r): r for r in (read_rows(path) if path.exists() else [])}
            for row in new_rows:
                merged[row_key(row)] = row
            _write_table(path, sorted(merged.values(), key=row_key))
            written.append(path)
        write_card(results_dir)
    return written


def dump_rows(rows: Sequence[Row], directory: Path) -> Path:
    """Write ``rows`` as a part directory under ``directory`` (for ``neuron-support merge``)."""
    writer = PartWriter(directory, session="unsaved")
    for row in rows:
        writer.add(row)
    return directory


class PartWriter:
    """Writes each finished row at once as its own JSON file (temp file + rename).

    A session killed mid-sweep leaves its finished rows here; the next session (or
    :func:`recover_parts`) merges them into the Parquet files.
    """

    def __init__(self, results_dir: Path, session: str | None = None) -> None:
        self.directory = results_dir / PARTS_DIR / (session or uuid.uuid4().hex)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._count = 0

    def add(self, row: Row) -> Path:
        self._count += 1
        return write_atomic(self.directory / f"{self._count:06d}.json", row.to_json())

    def rows(self) -> list[Row]:
        return _read_part_dir(self.directory)


def _read_part_dir(directory: Path) -> list[Row]:
    rows = []
    for path in sorted(directory.glob("*.json")):
        try:
            rows.append(Row.from_json(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):
            continue  # a torn write never got renamed into place; nothing to recover
    return rows


def recover_parts(results_dir: Path) -> int:
    """Merge rows left by killed sessions into Parquet; return how many were recovered."""
    parts = results_dir / PARTS_DIR
    if not parts.is_dir():
        return 0
    recovered = 0
    for directory in sorted(p for p in parts.iterdir() if p.is_dir()):
        rows = _read_part_dir(directory)
        write_rows(results_dir, rows)
        recovered += len(rows)
        shutil.rmtree(directory, ignore_errors=True)
    return recovered


def expected_seconds_from_dataset(results_dir: Path, device: str) -> dict[str, float]:
    """Seconds each model took last time on ``device`` (device run plus reference), newest stack wins."""
    seconds: dict[str, float] = {}
    try:
        rows = read_dataset(results_dir)
    except Exception:  # an unreadable old dataset only costs the ordering hint
        return seconds
    for row in sorted(rows, key=lambda r: r.timestamp):
        # A user test is no catalog run; a training row times another check (its items use the prior).
        if row.device == device and row.run_s is not None and not row.test and row.check == "inference":
            seconds[row.model_id] = row.run_s + (row.reference_s or 0.0)
    return seconds


@dataclass(frozen=True)
class Change:
    """How one model's result moved between two datasets.

    Attributes:
        model_id / device: the model and the device kind compared.
        check: the check compared (``inference`` or ``train``: each is a row of its own).
        kind: ``regressed`` (was PASS, now not, whatever the catalog expects: an expectation explains a
            failure, it does not make a model that passed stop passing unseen; or failing otherwise than
            its catalog expectation says), ``expected`` (failing otherwise than before, now as its catalog
            expectation says), ``unexpected-pass`` (it passed, or no longer recompiles, where its catalog
            expected otherwise), ``fixed`` (now PASS, was not, under the same parity mode),
            ``settings-differ`` (now PASS, was not, but the two rows were judged under different
            ``--parity`` modes: not a fix), ``new`` (only in the new dataset), ``missing`` (only in the
            old), or ``unchanged``. A gate fails on ``regressed`` and ``unexpected-pass``.
        old / new: the results compared (None where absent).
        test: the user's test that made the rows (node id), empty for a catalog item's.
        expected_reason: the new row's expectation's reason, where it has one.
        old_parity / new_parity: the rows' ``parity_mode`` (None where absent or not recorded).
    """

    model_id: str
    device: str
    kind: str
    old: str | None
    new: str | None
    check: str = "inference"
    test: str = ""
    expected_reason: str | None = None
    old_parity: str | None = None
    new_parity: str | None = None

    @property
    def parity_differs(self) -> bool:
        """Both rows say their parity mode, and the modes differ: the results are not comparable as they stand."""
        return modes_differ(self.old_parity, self.new_parity)


def modes_differ(old: str | None, new: str | None) -> bool:
    """Two rows' parity modes, both recorded and different: their results are not comparable as they stand."""
    return old is not None and new is not None and old != new


#: The kinds of :class:`Change` a gate fails on.
GATING: tuple[str, ...] = ("regressed", "unexpected-pass")


def latest_rows(rows: Iterable[Row], key: Callable[[Row], K]) -> dict[K, Row]:
    """The newest row (by timestamp) of each ``key`` in ``rows`` (:func:`row_key`: of each model, device, test
    and check)."""
    latest: dict[K, Row] = {}
    for row in sorted(rows, key=lambda r: r.timestamp):
        latest[key(row)] = row
    return latest


def diff_datasets(old_rows: Iterable[Row], new_rows: Iterable[Row]) -> list[Change]:
    """Compare each model's newest row in ``old_rows`` with its newest row in ``new_rows``."""
    old, new = latest_rows(old_rows, row_key), latest_rows(new_rows, row_key)
    changes = []
    for key in sorted(set(old) | set(new)):
        before = old[key].result if key in old else None
        after = new[key].result if key in new else None
        old_parity = old[key].parity_mode if key in old else None
        new_parity = new[key].parity_mode if key in new else None
        # How the new row compares with its catalog expectation (expect:), where it has one.
        expectation = new[key].expectation if key in new else None
        if expectation == "improved":
            kind = "unexpected-pass"
        elif before is None:
            kind = "new"
        elif after is None:
            kind = "missing"
        elif (before == "PASS" and after != "PASS") or expectation == "differs":
            # Whatever the catalog says: an expectation written after the fact must not turn the
            # day a model stopped passing into a green gate.
            kind = "regressed"
        elif before != "PASS" and after == "PASS":
            kind = "settings-differ" if modes_differ(old_parity, new_parity) else "fixed"
        elif before != after and expectation == "met":
            kind = "expected"
        else:
            kind = "unchanged"
        reason = new[key].expected_reason if key in new else None
        changes.append(Change(key[0], key[1], kind, before, after, key[3], key[2], reason, old_parity, new_parity))
    return changes


@dataclass(frozen=True)
class SignatureChange:
    """How one failure signature moved between two datasets.

    Attributes:
        signature: the failure signature (:func:`.signatures.signature`).
        kind: ``appeared`` (only the new dataset has it), ``disappeared`` (only the old one), or
            ``persisting`` (both).
        old_models / new_models: the models it blocks in each (empty where absent), sorted.
    """

    signature: str
    kind: str
    old_models: tuple[str, ...]
    new_models: tuple[str, ...]


def diff_signatures(old_rows: Iterable[Row], new_rows: Iterable[Row]) -> list[SignatureChange]:
    """The failure signatures of each model's newest row in ``old_rows`` and in ``new_rows``
    (the rows :func:`diff_datasets` compares): appeared first, then disappeared, then persisting,
    each by the number of models it blocks."""
    old = {b.signature: b.models for b in blockers(latest_rows(old_rows, row_key).values())}
    new = {b.signature: b.models for b in blockers(latest_rows(new_rows, row_key).values())}
    changes = []
    for sig in set(old) | set(new):
        kind = "persisting" if sig in old and sig in new else "appeared" if sig in new else "disappeared"
        changes.append(SignatureChange(sig, kind, old.get(sig, ()), new.get(sig, ())))
    order = {"appeared": 0, "disappeared": 1, "persisting": 2}
    return sorted(changes, key=lambda c: (order[c.kind], -max(len(c.old_models), len(c.new_models)), c.signature))


def blocking_summary(changes: Iterable[SignatureChange], new_models: Iterable[str]) -> str:
    """One line for ``neuron-support diff``: how many signatures appeared and disappeared, and what
    that did to the models: newly blocked (blocked now by an appeared signature, by none before),
    unblocked (blocked before by a disappeared signature, by none now, and still in the new dataset:
    ``new_models``, every model it has rows of), missing (such a model the new dataset has no row of:
    nothing says it runs now) and those a disappeared signature left that another one blocks now."""
    changes = list(changes)
    blocked_old = {m for c in changes for m in c.old_models}
    blocked_new = {m for c in changes for m in c.new_models}
    appeared = [c for c in changes if c.kind == "appeared"]
    gone = [c for c in changes if c.kind == "disappeared"]
    newly = {m for c in appeared for m in c.new_models} - blocked_old
    left = {m for c in gone for m in c.old_models}
    moved = left & blocked_new
    missing = left - moved - set(new_models)
    line = (
        f"signatures: {len(appeared)} appeared, {len(gone)} disappeared; "
        f"{len(newly)} model(s) newly blocked, {len(left - moved - missing)} model(s) unblocked"
    )
    if missing:
        line += f", {len(missing)} missing from the new dataset"
    return line + (f", {len(moved)} blocked by another signature now" if moved else "")


#: Free space a sweep needs in its results directory before it starts: rows are small, but
#: every item also keeps its run.py, result and log there. Less than this fails at start.
MIN_FREE_BYTES = 64 << 20


class ResultsDirFull(OSError):
    """The results directory has too little free space for a sweep to record its work."""


def check_writable(results_dir: Path, min_free: int = MIN_FREE_BYTES) -> None:
    """Raise OSError now, before the sweep, if rows could not be written later."""
    results_dir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(results_dir).free
    if free < min_free:
        raise ResultsDirFull(
            28,  # ENOSPC
            f"only {free / (1 << 20):.1f} MiB free, a sweep needs at least {min_free >> 20} MiB for rows, "
            "run.py files and logs",
        )
    probe = results_dir / f".write-probe-{uuid.uuid4().hex}"
    try:
        with open(probe, "wb") as handle:
            handle.write(b"\0" * 65536)  # a full disk fails here, not after an hour of work
            handle.flush()
            os.fsync(handle.fileno())
    finally:
        with contextlib.suppress(FileNotFoundError):
            probe.unlink()


def render_card(results_dir: Path) -> str:
    """The dataset card: Hub ``configs`` front matter, result and stage definitions, columns."""
    files = sorted((results_dir / DATA_DIR).glob("*.parquet"))
    lines = [
        "---",
        "configs:",
        "- config_name: default",
        "  data_files:",
        "  - split: train",
        "    path: data/*.parquet",
    ]
    for path in files:
        lines += [
            f"- config_name: {path.stem}",
            "  data_files:",
            "  - split: train",
            f"    path: {DATA_DIR}/{path.name}",
        ]
    lines += [
        "tags:",
        "- aws-neuron",
        "- trainium",
        "---",
        "",
        "# Model support on AWS Trainium (TorchNeuron)",
        "",
        "Each row says whether one Hugging Face Hub model ran unmodified through TorchNeuron",
        '(`from_pretrained(device_map="neuron")`, greedy `generate()` with a static cache, compiled',
        "decoding) on one software stack, and the evidence. Made by pytest-neuron-support; one",
        "Parquet file per (neuronx-cc version, library, library version).",
        "",
        "```python",
        "import pandas as pd",
        "",  # a blank line after the import: the card's Python is as ruff formats it
        'df = pd.read_parquet("data")',
        'df[(df.neuronx_cc == "<version>") & (df.result == "PASS")][["model_id", "neuron_cores"]]',
        "```",
        "",
        "## Results",
        "",
        "| result | meaning |",
        "|---|---|",
    ]
    lines += [f"| `{name}` | {text} |" for name, text in RESULTS.items()]
    lines += ["", "## What each verdict rests on", ""]
    lines += [
        "Every row's `verdict_basis` names the evidence that decided it. Generation rows carry the teacher-forced",
        "CPU check's figures (`cpu_check`, `positions_checked`, `positions_disagreeing`, `first_disagreement`,",
        "`disagreement_deficit`, `max_logprob_deficit`); sharded rows keep the judge's verdict beside it",
        "(`judge_verdict`, `judge_score`) whether or not it decided.",
        "",
        "| verdict_basis | evidence | PASS rows here |",
        "|---|---|---|",
    ]
    rows = read_dataset(results_dir)
    passes: dict[str, int] = {}
    for row in rows:
        if row.result == "PASS":
            passes[str(row.verdict_basis)] = passes.get(str(row.verdict_basis), 0) + 1
    lines += [f"| `{name}` | {text} | {passes.get(name, 0)} |" for name, text in VERDICT_BASES.items()]
    hosted = [row.model_id for row in rows if row.result == "PASS" and row.fallback_ops]
    lines += [
        "",
        f"PASS rows that ran operations on the host instead of the device (`fallback_ops`): {len(hosted)}"
        + (f" ({', '.join(sorted(hosted))})." if hosted else "."),
    ]
    trained = [row for row in rows if row.check == "train"]
    lines += [
        "",
        "## The training check",
        "",
        "Rows with `check` = `train` come from train.py, not run.py: the model loaded on the device (sharded with",
        "`DistributedConfig` when the plan says so), Trainer with `TrainingArguments(bf16=<weights are bf16>,",
        "torch_compile=True, torch_compile_backend=<the device's>, dataloader_drop_last=True,",
        f"max_steps={TRAIN_STEPS})`, batches of {TRAIN_BATCH} from a fixed text set padded to {TRAIN_MAX_LENGTH}",
        f'tokens (`padding="max_length"`: fixed shapes), learning rate {TRAIN_LEARNING_RATE:g}, seed {TRAIN_SEED};',
        "the same train.py eagerly on CPU with the same data. PASS when every device loss is finite, at every step",
        f"abs(device - cpu) <= {LOSS_ATOL} + {LOSS_RTOL} x abs(cpu) for the loss and the gradient norm is within",
        f"{GRAD_NORM_RTOL:.0%} of the CPU's (a corrupted gradient shows in its own step's norm; the loss moves only",
        "from the next step on, and AdamW's normalised update can keep that move small), and no graph is compiled",
        "after the first step (`recompiles`). The tolerance rests on a measurement: torch.compile (inductor) against",
        "eager on CPU, bf16, 3 steps of the tiny zoo's smollm3 and qwen3, differed by at most 8e-3 nats (1.2e-3",
        "relative) in the loss and 1.1 % in the gradient norm. The planner sizes training runs by weights +",
        "gradients + AdamW's two moments, all in the weights' dtype (4 x the weight bytes; `train_state_bytes`",
        "is what train.py held).",
        f"This dataset: {len(trained)} training row(s), {sum(r.result == 'PASS' for r in trained)} PASS.",
    ]
    lines += ["", "## Failure stages", "", "| failure_stage | meaning |", "|---|---|"]
    lines += [f"| `{name}` | {text} |" for name, text in STAGES.items()]
    found = blockers(rows)
    lines += [
        "",
        "## Failure signatures",
        "",
        "Every ERROR, FAIL and TIMEOUT row has a `signature`, the same for every model that fails the same way, so",
        "the one bug that blocks the most models is one group (`neuron-support failures` lists them):",
        "`<stage>: <ExceptionType>[ <operation or module>]: <message>`. The message is the error's first line",
        f"(continued while it ends with `:`), cut to {MAX_MESSAGE} characters, after the row's own model id, its",
        "slug and its test id became `<model>` and `<test>` and these rules ran, in order (signals, exit codes and",
        "errno values are kept):",
        "",
        "| rule | becomes | why |",
        "|---|---|---|",
    ]
    for rule in RULES:
        becomes = rule.replacement if isinstance(rule.replacement, str) else "<path>/<file name>"
        shown = {"": "(removed)", " ": "one space"}.get(becomes, f"`{becomes}`")
        lines.append(f"| {rule.name} | {shown} | {rule.why} |")
    lines += [
        "",
        "Out-of-memory errors from torch, CUDA, the Neuron runtime or the host allocator are one signature per",
        "kind of memory (`OutOfMemory device`, `OutOfMemory host`). Parity FAILs are bucketed by where the tokens",
        f"first went wrong ({', '.join(name for _, _, name in BUCKETS)}, or later) and which check failed",
        "(free-running, teacher-forced, both; near-ties said); a warm run that differs by where it parts.",
        "",
        f"This dataset: {len(found)} signature(s) blocking {len({m for b in found for m in b.models})} model(s).",
    ]
    lines += ["", "## Columns", "", "| column | type | meaning |", "|---|---|---|"]
    lines += [f"| `{name}` | {COLUMN_TYPES[name]} | {COLUMN_DOCS[name]} |" for name in COLUMN_DOCS]
    return "\n".join(lines) + "\n"


def write_card(results_dir: Path) -> Path:
    return write_atomic(results_dir / "README.md", render_card(results_dir))
