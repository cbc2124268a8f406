"""The whole story of one row, in the order it happened: what ``neuron-support explain MODEL`` prints.

The plan (cores and why), each stage with its time, every piece of evidence the row holds and what the
verdict rested on, the first diverging module of a numerics FAIL, the failure signature and the other
models of the same stack that share it, the catalog's expectation and its reason, and the commands that
reproduce it. Every line is read from the row's own columns (``data.records.Row``, whose docs say what
each means): nothing here is measured again.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from pytest_neuron_support.data.dataset import stack_stem
from pytest_neuron_support.data.records import COLUMN_LABELS, STAGES, VERDICT_BASES, Row

#: What a stage's time is, in the order a check runs them: (column, what it timed).
TIMES: tuple[tuple[str, str], ...] = (
    ("load_s", "load (from_pretrained onto the device)"),
    ("compile_s", "compile (first call less the warm one)"),
    ("first_generate_s", "first call (compiles)"),
    ("generate_s", "warm call"),
    ("run_s", "the device run.py as a whole"),
    ("reference_s", "CPU reference"),
    ("cpu_check_s", "teacher-forced CPU check"),
    ("train_first_step_s", "first training step"),
)

#: The evidence columns, in the order the checks make them: free-running parity, teacher-forced CPU check,
#: embeddings and numerics under the calibrated rule, the judge, the warm repeat, training, the compiled graphs.
EVIDENCE: tuple[str, ...] = (
    "reference_match",
    "matched_prefix",
    "first_divergence",
    "device_token",
    "reference_token",
    "logprob_gap",
    "near_tie",
    "cpu_check",
    "positions_checked",
    "positions_disagreeing",
    "first_disagreement",
    "disagreement_device_token",
    "disagreement_cpu_token",
    "disagreement_deficit",
    "max_logprob_deficit",
    "disagreements_near_tie",
    "min_cosine",
    "cosine_threshold",
    "image_psnr",
    "evidence_stage",
    "evidence_step",
    "evidence_distance",
    "noise_floor",
    "noise_ratio",
    "judge_verdict",
    "judge_score",
    "repeat_identical",
    "repeat_divergence",
    "train_first_bad_step",
    "train_max_loss_delta",
    "graphs_compiled",
    "recompiles",
    "graph_breaks",
    "recompile_limit",
    "fallback_ops",
    "fallback_ops_unknown",
    "fallback_calls",
)


def story(row: Row, stack_rows: Sequence[Row], instructions: str) -> str:
    """``row``'s account, as lines of text; ``stack_rows`` are the rows of its stack (who shares its
    signature), ``instructions`` how to rerun its run.py (``viewer.report.Reproduction.instructions``)."""
    stem = stack_stem(row)
    where = f" at stage {row.failure_stage}" if row.failure_stage else ""
    lines = [
        f"{row.model_id}: {row.result}{where}  ({row.check} check, task {row.task}, on {row.device}, stack {stem})",
        "",
        "1. plan",
        f"   {_plan(row)}",
        "",
        "2. stages",
        *(f"   {line}" for line in _times(row)),
        "",
        "3. evidence",
        f"   decided by {row.verdict_basis or 'nothing'}: {VERDICT_BASES.get(row.verdict_basis or '', 'no verdict')}",
        *(f"   {line}" for line in _evidence(row)),
    ]
    if row.error:
        stage = STAGES.get(row.failure_stage or "", "")
        lines += ["", f"4. {row.result}{where}" + (f" ({stage})" if stage else ""), f"   {row.error}"]
        if row.compiler_error_code:
            lines.append(f"   the compiler's error code: {row.compiler_error_code}")
    else:
        lines += ["", f"4. {row.result}", "   no error"]
    lines += ["", "5. first diverging module", f"   {_module(row)}"]
    lines += ["", "6. failure signature", *(f"   {line}" for line in _signature(row, stack_rows))]
    lines += ["", "7. expectation", f"   {_expectation(row)}"]
    lines += ["", "8. reproduce it", f"   neuron-support runscript {shlex.quote(row.model_id)} --stack {stem}"]
    if row.reproducer:
        lines.append(
            f"   the standalone reproducer ({row.reproducer_note}): "
            f"neuron-support runscript {shlex.quote(row.model_id)} --stack {stem} --reproducer > "
            f"{Path(row.reproducer).name}"
        )
    elif row.reproducer_note:
        lines.append(f"   no standalone reproducer: {row.reproducer_note}")
    if row.fallback_reproducer:
        lines.append(
            f"   the fallback reproducer ({row.fallback_note}): "
            f"neuron-support runscript {shlex.quote(row.model_id)} --stack {stem} --fallbacks > run.py"
        )
    elif row.fallback_note:
        lines.append(f"   no fallback reproducer: {row.fallback_note}")
    lines += [f"   {line}" for line in instructions.splitlines()]
    return "\n".join(lines) + "\n"


def _plan(row: Row) -> str:
    if row.neuron_cores is None:
        return f"no plan: {row.plan_reason or row.error or 'nothing ran'}"
    size = f", {row.parameters:,} parameters" if row.parameters else ""
    shard = f", tensor parallel {row.tp_size}" if (row.tp_size or 1) > 1 else ""
    shard += f", expert parallel {row.ep_size}" if (row.ep_size or 1) > 1 else ""
    first = f" from core {row.first_core}" if row.first_core is not None else ""
    why = f": {row.plan_reason}" if row.plan_reason else ""
    return f"{row.neuron_cores} core(s){first}{shard}, {row.dtype}{size}{why}"


def _times(row: Row) -> list[str]:
    times = [f"{what}: {getattr(row, name):.2f} s" for name, what in TIMES if getattr(row, name) is not None]
    return times or ["no stage ran"]


def _evidence(row: Row) -> list[str]:
    lines = []
    for name in EVIDENCE:
        value = getattr(row, name)
        if value is None or value == ():
            continue
        label = COLUMN_LABELS[name]
        shown = name if label == name else f"{label} ({name})"
        lines.append(f"{shown}: {', '.join(map(str, value)) if isinstance(value, tuple) else value}")
    if row.numeric_stages:
        pairs = ", ".join(f"{s} {r:g}x" for s, r in zip(row.numeric_stages, row.numeric_ratios, strict=False))
        lines.append(f"every numeric comparison's noise ratio: {pairs}")
    return lines or ["none recorded"]


def _module(row: Row) -> str:
    if row.diverging_module is not None:
        kind = f" ({row.diverging_module_kind})" if row.diverging_module_kind else ""
        inside = f"; the last module inside was {row.last_inside_module}" if row.last_inside_module else ""
        return (
            f"{row.diverging_module}{kind}: relative distance from float32 {row.diverging_distance:.4g}, "
            f"{row.diverging_ratio:.3g}x the dtype's own noise{inside} ({row.locate_note})"
        )
    if row.locate_note:
        return row.locate_note
    if row.result == "FAIL" and row.failure_stage == "parity":
        return "not searched (a row written before the module search)"
    return "not searched: the search runs only after a numerics FAIL"


def _signature(row: Row, stack_rows: Sequence[Row]) -> list[str]:
    if row.signature is None:
        return [f"none: a {row.result} row blocks nothing"]
    others = sorted({r.model_id for r in stack_rows if r.signature == row.signature and r.model_id != row.model_id})
    shared = f"shared by {len(others)} other model(s) of this stack" + (f": {', '.join(others)}" if others else "")
    return [row.signature, shared]


def _expectation(row: Row) -> str:
    if row.expected_result is None:
        return "none: the catalog expects a PASS"
    stage = f" at {row.expected_stage}" if row.expected_stage else ""
    reason = f" because {row.expected_reason}" if row.expected_reason else ""
    return f"the catalog expects {row.expected_result}{stage}{reason}; this row: {row.expectation or 'not compared'}"
