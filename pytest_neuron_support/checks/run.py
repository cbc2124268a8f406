"""One check of one model end to end, whatever its kind: lease window, device run, release, failure
mapping, verdict. Nothing here raises for a model's failure: every outcome is a row, so one broken
model never stops a sweep.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path

from pytest_neuron_support.base.model import ModelSpec
from pytest_neuron_support.base.redaction import scrub
from pytest_neuron_support.checks.kind import CheckKind
from pytest_neuron_support.checks.rows import planned_row
from pytest_neuron_support.data.records import Row
from pytest_neuron_support.data.signatures import compiler_error_code
from pytest_neuron_support.planning.planner import Plan
from pytest_neuron_support.run.context import DEVICE_RUN, Job
from pytest_neuron_support.run.execution import failure_of, stage_name
from pytest_neuron_support.run.fallbacks import capture_fallbacks
from pytest_neuron_support.run.repro import capture_compile_failure
from pytest_neuron_support.run.runscript import RunSpec, TrainSpec
from pytest_neuron_support.run.settings import Settings, run_dir
from pytest_neuron_support.verdict import decide


def run_check(
    kind: CheckKind,
    model: ModelSpec,
    settings: Settings,
    plan: Plan,
    *,
    cores: tuple[int, int] = (0, 1),
    post_load: str = "",
    env: Mapping[str, str] | None = None,
    release: Callable[[], None] | None = None,
    workdir: Path | None = None,
    planned: Row | None = None,
    relet: Callable[[], AbstractContextManager[tuple[int, int]]] | None = None,
) -> Row:
    """Check one model end to end and return its row. ``cores`` is the lease (first, count).

    ``release`` is called the moment the device run ends: the verdict (the CPU side, the judge) needs no
    device cores, so the lease's holder can hand them to the next item. The caller that already built
    the planned row (to see whether it runs at all) hands it over as ``planned``.
    """
    environ = dict(os.environ if env is None else env)
    first, count = cores
    planned = kind.planned(planned_row(model, settings, plan), model, settings) if planned is None else planned
    row = replace(planned, first_core=first, lease_start=round(time.time(), 3))
    if workdir is None:
        workdir = run_dir(settings.results_dir, settings.device.name, model.id) / kind.folder
    job = Job(model, settings, plan, workdir, environ, relet)
    side = kind.start_cpu_side(job, row)
    spec = kind.device_spec(job, post_load)
    try:
        source, outcome = job.execute_on_device(spec, DEVICE_RUN, settings.device.pin_cores(first, count))
    except BaseException:
        side.cancel()
        raise
    finally:
        lease_end = round(time.time(), 3)
        if release is not None:
            release()
    row = replace(row, runscript=source, run_s=round(outcome.wall_s, 3), lease_end=lease_end)
    result = outcome.result
    if result is not None:
        row = kind.with_result(job, row, result)
    if result is None or not result.get("ok"):
        side.cancel()
        status, stage, error = failure_of(outcome, kind.script, offline=settings.hub_unreachable, checkpoint=model.id)
        failed = decide.run_failed(status, stage_name(stage, False), scrub(error, environ) or "")
        row = replace(row, **failed.fields(), compiler_error_code=compiler_error_code(failed.error))
        if status == "ERROR" and failed.failure_stage == "compile" and isinstance(spec, RunSpec):
            # The graph the backend failed on, as a script of its own: one more device run, for the backend's compile
            # ERROR only (run.repro says which).
            captured = capture_compile_failure(job, spec, failed.error or "")
            script = None if captured.script is None else job.in_results(captured.script)
            row = replace(row, reproducer=script, reproducer_note=captured.note)
        return with_fallback_calls(job, spec, row)
    return with_fallback_calls(job, spec, kind.locate(job, kind.decide(job, row, result, side), result, spec))


def with_fallback_calls(job: Job, spec: RunSpec | TrainSpec, row: Row) -> Row:
    """A run whose device fell back to the host: the calls of those ops with their dtypes and shapes, and their
    reproducer (one more eager device run: ``run.fallbacks``); any other row as it is."""
    if not row.fallback_ops or not isinstance(spec, RunSpec):
        return row
    captured = capture_fallbacks(job, spec, row.fallback_ops)
    script = None if captured.script is None else job.in_results(captured.script)
    return replace(row, fallback_calls=captured.calls, fallback_reproducer=script, fallback_note=captured.note)
