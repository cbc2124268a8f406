"""The inference check (a row's ``check`` is ``inference``): run.py on the device, the unmodified path
a user takes (``from_pretrained(..., device_map=<device>)``, inputs on CPU, the device's compile
backend), checked against the CPU model of the same checkpoint as its task says (:mod:`..tasks`).

The warm second run must repeat the first (else FAIL at ``generate``); then the task decides: a
one-core generation run against its free-running CPU reference and teacher-forced, a sharded one
teacher-forced (the judge's verdict kept), an embedding by cosine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from pytest_neuron_support.base.model import ModelSpec
from pytest_neuron_support.checks.kind import CpuSide, NoCpuSide
from pytest_neuron_support.cpu.locate import locate, module_reproducer
from pytest_neuron_support.cpu.reference import ReferenceRun
from pytest_neuron_support.data.records import Row
from pytest_neuron_support.devices.table import DEVICES
from pytest_neuron_support.run.context import Job
from pytest_neuron_support.run.runscript import RunSpec, TrainSpec
from pytest_neuron_support.run.settings import Settings
from pytest_neuron_support.tasks.table import task_of
from pytest_neuron_support.tasks.task import Task
from pytest_neuron_support.verdict import modules


class InferenceCheck:
    """Does the model run unmodified on the device, and say what the CPU says?"""

    name = "inference"
    test = "test_model"
    fixture = "neuron_check"
    folder = ""
    script = "run.py"
    training = False
    summary = "run.py: the task's compiled forward or greedy generation, checked against the CPU model"

    def applies_to(self, task: Task) -> bool:
        return True

    def hash_parts(self) -> list[str]:
        return []

    def planned(self, row: Row, model: ModelSpec, settings: Settings) -> Row:
        return row

    def device_spec(self, job: Job, post_load: str) -> RunSpec:
        task = task_of(job.model.task)
        return task.run_spec(
            job.model, job.settings, device=job.settings.device, reference=False, post_load=post_load, plan=job.plan
        )

    def reference_spec(self, job: Job) -> RunSpec:
        """Its free-running CPU reference: the same run.py on CPU, eager, in the reference dtype."""
        return task_of(job.model.task).run_spec(
            job.model, job.settings, device=DEVICES["cpu"], reference=True, post_load=""
        )

    def start_cpu_side(self, job: Job, row: Row) -> CpuSide:
        # The free-running CPU reference: the seed's exact parity for one-core runs, and what an embedding
        # is compared with. A sharded generation run is checked teacher-forced only: a free-running CPU run
        # of a model that needs 16 cores is 32 slow decode steps, one forward is not.
        if task_of(job.model.task).free_reference(job.sharded):
            return ReferenceRun(job, self.reference_spec(job))
        return NoCpuSide()

    def with_result(self, job: Job, row: Row, result: Mapping[str, Any]) -> Row:
        return task_of(job.model.task).with_result(row, result)

    def decide(self, job: Job, row: Row, result: Mapping[str, Any], side: CpuSide) -> Row:
        task = task_of(job.model.task)
        repeat = task.repeat(row, result)
        if repeat is not None:
            side.cancel()
            return replace(row, **repeat.fields())
        return task.decide(job, row, result, side if isinstance(side, ReferenceRun) else None)

    def locate(self, job: Job, row: Row, result: Mapping[str, Any], spec: RunSpec | TrainSpec) -> Row:
        """A numerics FAIL (at ``parity``): the first diverging module (``cpu.locate``), into the row's columns and
        its error; the row says why where its task has no module search or the search could not run."""
        if row.result != "FAIL" or row.failure_stage != "parity":
            return row
        assert isinstance(spec, RunSpec)
        task = task_of(job.model.task)
        options = task.locate_options(row, result)
        if options is None:
            return replace(row, locate_note=f"not searched: the {task.name} task has no module search yet")
        if isinstance(options, str):
            return replace(row, locate_note=f"not searched: {options}")
        found = locate(job, spec, self.reference_spec(job), options)
        if found.divergence is None:
            return replace(row, locate_note=found.note)
        fields = modules.row_fields(found.divergence)
        fields["locate_note"] = f"{fields['locate_note']} ({found.note})"
        first = found.divergence.first
        if first is not None:
            fields["error"] = f"{row.error}; {found.divergence.describe()}"
            if job.sharded:
                fields["reproducer_note"] = (
                    f"not written: on {job.plan.cores} cores the module alone needs each rank's slice of its inputs, "
                    "which the reproducer does not cut; the search's own run.py (locate-device/) reruns the forward"
                )
                return replace(row, **fields)
            script = module_reproducer(job, spec, options, first.stage)
            fields["reproducer"] = job.in_results(script)
            beside = (
                f" (it reads {options['recording']} beside it: keep the two together)"
                if options.get("recording")
                else ""
            )
            fields["reproducer_note"] = (
                f"the first diverging module alone: python3 run.py --out result.json (on the device) feeds "
                f"{first.stage} the inputs it records from the CPU model and prints its distance and ratio{beside}"
            )
        return replace(row, **fields)
