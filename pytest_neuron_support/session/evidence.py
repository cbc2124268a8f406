"""What one test's neuron fixtures saw (:class:`Evidence`), and the row it makes: a catalog item's is the
row its check made (:func:`catalog_row`); a user's own test's is built from what its fixtures saw, with
the test's own outcome as the result (:func:`user_row`). The comparisons are the catalog's own (its
task's ``with_result`` and ``compare``), so the same outputs give the same evidence either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from pytest_neuron_support.base.model import ModelSpec
from pytest_neuron_support.base.redaction import scrub
from pytest_neuron_support.checks.registry import KINDS
from pytest_neuron_support.checks.rows import base_row, planned_row
from pytest_neuron_support.cpu.reference import ReferenceRun
from pytest_neuron_support.data.records import Row
from pytest_neuron_support.planning.planner import Plan
from pytest_neuron_support.run.settings import Settings
from pytest_neuron_support.session.handles import CoreLease, CpuReference, DeviceRun, JudgeVerdict
from pytest_neuron_support.session.keys import check_key, model_key
from pytest_neuron_support.tasks.table import task_of

#: The fixtures this module provides; a test that uses any of them gets a row.
FIXTURES: tuple[str, ...] = (
    "neuron_cores",
    "neuron_model",
    "neuron_plan",
    "neuron_run",
    "neuron_reference",
    "neuron_judge",
    "neuron_check",
    "neuron_pipeline_check",
    "neuron_train_check",
)
#: Characters of a failed test's exception kept in its row.
ERROR_CHARS = 4000
#: What the neuron fixtures of one item saw, for its row.
evidence_key = pytest.StashKey["Evidence"]()


@dataclass
class Evidence:
    """What one item's neuron fixtures saw (mutable: filled in as they run, read for its row).

    Attributes:
        model / plan / lease / run / reference: what each fixture produced.
        verdicts: every judge call, in order (the row keeps the last).
        failure: (result, stage, error) a fixture recorded before failing the test.
        skip_stage: the stage that skipped the test (``plan``: more cores than the pool).
        gated: the catalog's row for a model that must not run (remote code not allowed): the test's
            row is that EXCLUDED row.
        reference_run: the CPU reference started beside the device run.
        row: the row ``neuron_check`` made (a catalog item's row is exactly this).
        resumed: ``--resume`` found this catalog item's row already recorded: it gets no new one.
        started / started_model: the marker its crash row is made from has been written (naming
            this model).
    """

    model: ModelSpec | None = None
    plan: Plan | None = None
    lease: CoreLease | None = None
    run: DeviceRun | None = None
    reference: CpuReference | None = None
    verdicts: list[JudgeVerdict] = field(default_factory=list)
    failure: tuple[str, str, str] | None = None
    skip_stage: str | None = None
    gated: Row | None = None
    reference_run: ReferenceRun | None = None
    row: Row | None = None
    resumed: bool = False
    started: bool = False
    started_model: str | None = None


def evidence_of(item: pytest.Item) -> Evidence:
    if evidence_key not in item.stash:
        item.stash[evidence_key] = Evidence()
    return item.stash[evidence_key]


def uses_fixtures(item: pytest.Item) -> bool:
    """Whether a test uses any of the neuron fixtures (then it gets a row)."""
    return not set(FIXTURES).isdisjoint(getattr(item, "fixturenames", ()))


def catalog_row(item: pytest.Item, evidence: Evidence, report: pytest.TestReport, settings: Settings) -> Row:
    """A catalog item's row: the one ``neuron_check`` made; else the reason nothing ran (EXCLUDED,
    SKIPPED or ERROR at plan); else the harness broke before the check (ERROR at ``harness``)."""
    if evidence.row is not None:
        return evidence.row
    model = item.stash[model_key]
    # An item's row is its check kind's whatever stopped it (its check is part of its key).
    kind = KINDS[item.stash.get(check_key, "inference")]
    if evidence.gated is not None:
        return kind.planned(evidence.gated, model, settings)
    row = base_row(model, settings) if evidence.plan is None else planned_row(model, settings, evidence.plan)
    row = kind.planned(row, model, settings)
    if row.failure_stage == "plan":
        return row
    text = scrub(report.longreprtext) or ""
    return replace(row, result="ERROR", failure_stage="harness", verdict_basis="run", error=text[:ERROR_CHARS])


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(getattr(report, "wasxfail", "") or longrepr or "")


def user_row(
    item: pytest.Item, evidence: Evidence, report: pytest.TestReport, call: pytest.CallInfo[None], settings: Settings
) -> Row:
    """The row of a user's own test: identity (the model's, else the test's), plan, lease, the device
    run, the reference and the judge as its fixtures saw them, and the test's outcome as the result."""
    model = evidence.model
    if model is not None and evidence.plan is not None:
        row = planned_row(model, settings, evidence.plan)
    elif model is not None:
        row = base_row(model, settings)
    else:
        # No model: the test is the subject (its own process on leased cores, say).
        row = replace(
            base_row(ModelSpec(id=item.nodeid, source="test"), settings),
            task="",
            dtype="",
            prompt=None,
            max_new_tokens=None,
        )
    row = replace(row, test=item.nodeid, source="test", verdict_basis="test")
    if evidence.row is not None:
        # neuron_check made the row; the test's outcome still decides its result (unless the
        # check's own non-PASS result is what failed it).
        checked = replace(evidence.row, test=item.nodeid, source="test")
        if evidence.row.result != "PASS" and report.failed and report.when == "call":
            return checked
        return replace(checked, **_outcome_fields(evidence, report, call))
    lease = evidence.lease
    if lease is not None:
        row = replace(
            row,
            neuron_cores=lease.count,
            first_core=lease.first,
            lease_start=round(lease.acquired, 3),
            # A lease the test still holds is released at its teardown, right after this report.
            lease_end=round(lease.released_at if lease.released_at is not None else report.stop, 3),
        )
    run = evidence.run
    if run is not None:
        row = replace(row, runscript=run.runscript, run_s=run.timings.run_s)
        if run.result is not None:
            row = task_of(run.spec.task).with_result(row, run.result)
    reference = evidence.reference
    if reference is not None:
        row = replace(
            row,
            reference_dtype=reference.spec.dtype,
            reference_s=reference.wall_s,
            reference_cached=reference.cached,
            reference_tokens=tuple(reference.tokens),
        )
        if run is not None and run.ok and model is not None:
            # The catalog's comparison of the same outputs (tokens, or an embedding's cosines): evidence
            # only, the test's own outcome is the result.
            compared = {**(run.result or {}), "tokens": run.tokens}
            row = task_of(run.spec.task).compare(row, model, compared, reference.result)
    if evidence.verdicts:
        verdict = evidence.verdicts[-1]
        row = replace(
            row,
            judge_model=verdict.judge_model,
            judge_revision=verdict.judge_revision,
            judge_verdict=verdict.verdict,
            judge_score=verdict.score,
        )
    return replace(row, **_outcome_fields(evidence, report, call))


def _outcome_fields(evidence: Evidence, report: pytest.TestReport, call: pytest.CallInfo[None]) -> dict[str, Any]:
    """result, failure_stage, error (and verdict_basis where a run decided) from the test's outcome."""
    if report.passed:
        return {"result": "PASS", "failure_stage": None, "error": None}
    if report.skipped and evidence.gated is not None:
        gated = evidence.gated
        return {
            field: getattr(gated, field)
            for field in ("result", "failure_stage", "verdict_basis", "exclude_reason", "exclude_note", "error")
        }
    if report.skipped:
        return {"result": "SKIPPED", "failure_stage": evidence.skip_stage, "error": _skip_reason(report)}
    if report.when == "setup" and evidence.failure is not None:
        status, stage, error = evidence.failure
        return {"result": status, "failure_stage": stage, "error": error[:ERROR_CHARS], "verdict_basis": "run"}
    excinfo = call.excinfo
    text = excinfo.exconly() if excinfo is not None else report.longreprtext
    # An assertion that failed is a wrong answer (FAIL); anything else raised is an ERROR.
    failed = report.when == "call" and excinfo is not None and isinstance(excinfo.value, AssertionError)
    return {
        "result": "FAIL" if failed else "ERROR",
        "failure_stage": "test",
        "error": (scrub(text) or "")[:ERROR_CHARS],
    }
