"""A row's identity before anything runs: the model's and the stack's (:func:`base_row`), why a model
must not run (:func:`gate`), its plan (:func:`planned_row`), and what makes two rows comparable
(:func:`settings_hash`). What a run adds to it is its check kind's and its task's to say.
"""

from __future__ import annotations

import datetime
import hashlib
from collections.abc import Sequence
from dataclasses import replace

from pytest_neuron_support import __version__
from pytest_neuron_support.base.model import Expectation, ModelSpec
from pytest_neuron_support.data.records import Row, installed_version
from pytest_neuron_support.planning.planner import DTYPE_BYTES, Plan
from pytest_neuron_support.run.settings import Settings, core_pool, result_settings
from pytest_neuron_support.tasks.table import task_of
from pytest_neuron_support.verdict import expected


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def settings_hash(model: ModelSpec, settings: Settings, extra: Sequence[str] = ()) -> str:
    """What makes two rows of one model on one stack comparable: a rerun with the same hash
    would repeat the same check (``--resume`` skips it). ``extra``: a check kind's own parts
    (``CheckKind.hash_parts``; the inference check has none)."""
    task = task_of(model.task)
    # The model's own parts (its prompt as the task reads it: the entry's, else the session's), then every
    # setting declared to change a result (run.settings: CHANGES_RESULT), then the task's and the kind's.
    parts = [
        model.id,
        model.revision,
        model.task,
        model.dtype,
        str(task.prompt(model, settings.prompt)),
        str(model.cores),
    ]
    parts += result_settings(settings)
    parts += task.hash_parts(model)
    parts += extra
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:16]


def base_row(model: ModelSpec, settings: Settings) -> Row:
    """A row with the model's and stack's identity filled in, before anything runs (an inference row: a
    check kind's ``planned`` makes it its own)."""
    stack = settings.stack
    task = task_of(model.task)
    return Row(
        settings_hash=settings_hash(model, settings),
        model_id=model.id,
        result="ERROR",
        revision=model.revision,
        task=model.task,
        source=model.source,
        tags=model.tags,
        device=settings.device.name,
        dtype=model.dtype,
        prompt=task.prompt(model, settings.prompt),
        max_new_tokens=task.max_new_tokens(settings),
        neuronx_cc=stack.neuronx_cc,
        torch_neuronx=stack.torch_neuronx,
        torch=stack.torch,
        # The task's own library (a diffusers pipeline's row is diffusers'), so a row that never ran lands in
        # the same stack's Parquet file as the rows of that task that did.
        library=task.library,
        library_version=stack.library_version if task.library == stack.library else installed_version(task.library),
        python=stack.python,
        timestamp=_now(),
        plugin_version=__version__,
        self_check=settings.self_check,
    )


def gate(model: ModelSpec, settings: Settings) -> Row | None:
    """The row for a model that must not run (excluded, remote code not allowed), else None."""
    row = base_row(model, settings)
    if model.exclude is not None:
        return replace(
            row,
            result="EXCLUDED",
            verdict_basis="catalog",
            exclude_reason=model.exclude.reason,
            exclude_note=model.exclude.note,
            error=f"excluded ({model.exclude.reason}): {model.exclude.note}".rstrip(": "),
        )
    if model.trust_remote_code and not settings.allow_remote_code:
        return replace(
            row,
            result="EXCLUDED",
            verdict_basis="catalog",
            exclude_reason="remote-code",
            exclude_note="needs trust_remote_code; rerun with --allow-remote-code to run the repository's code",
            error="remote code not allowed: pass --allow-remote-code to run it",
        )
    return None


def planned_row(model: ModelSpec, settings: Settings, plan: Plan) -> Row:
    """The row before running: identity and plan; SKIPPED when the plan cannot run here."""
    row = replace(
        base_row(model, settings),
        neuron_cores=plan.cores or None,
        tp_size=plan.tp_size,
        ep_size=plan.ep_size,
        plan_reason=plan.reason,
        # weight_bytes is 0 when the model could not be inspected: unknown, not zero.
        weight_bytes=plan.weight_bytes or None,
        parameters=plan.weight_bytes // DTYPE_BYTES[model.dtype] if plan.weight_bytes else None,
        compile_backend=settings.compile_backend,
    )
    if plan.error is not None:
        return replace(row, result="ERROR", failure_stage="plan", verdict_basis="plan", error=plan.error)
    if plan.skip is not None:
        return replace(row, result="SKIPPED", failure_stage="plan", verdict_basis="plan", error=plan.skip)
    fits = core_pool(settings).largest_block() if settings.core_ledger is not None else settings.neuron_cores
    if plan.cores > fits:
        return replace(
            row,
            result="SKIPPED",
            failure_stage="plan",
            verdict_basis="plan",
            error=f"needs {plan.cores} cores but the pool has {settings.neuron_cores}"
            + (f" (at most {fits} contiguous)" if fits < settings.neuron_cores else "")
            + f"; pass --neuron-cores={plan.cores} or more on a machine that has them",
        )
    return row


def with_expectation(row: Row, expect: Expectation | None) -> Row:
    """The entry's expectation of the row's check (``expect:``) into the row, and the row against it
    (``expectation``: met, improved or differs; :mod:`..verdict.expected`). The row keeps its real result."""
    if expect is None or expect.check != row.check:
        return row
    outcome = expected.compare(
        expect, row.result, row.failure_stage, row.signature, recompiled=row.recompile_limit is not None
    )
    return replace(
        row,
        expected_result=expect.result,
        expected_stage=expect.stage,
        expected_signature=expect.signature,
        expected_recompiles=expect.recompiles,
        expected_reason=expect.reason,
        expectation=outcome,
    )


def expectation_of(row: Row) -> Expectation | None:
    """The expectation a row was checked against, read back from its columns (None without one)."""
    if row.expected_result is None:
        return None
    return Expectation(
        result=row.expected_result,
        reason=row.expected_reason or "",
        check=row.check,
        stage=row.expected_stage,
        signature=row.expected_signature,
        recompiles=bool(row.expected_recompiles),
    )
