"""The pipeline check (a row's ``check`` is ``pipeline``): the same model through
``transformers.pipeline(<task>, model=<id>, device=<device>)``, the Transformers guide's second way onto
the device, beside the direct path (``from_pretrained(device_map=<device>)``) the inference check takes.

run.py loads it with the pipeline (``templates/tasks/pipeline.py``) and calls the pipeline twice with the
direct path's generation settings (``templates/tasks/pipeline_call.py``). Two questions decide the row:

* Did the model run on the device? Where the pipeline put every parameter and buffer is read right after
  loading; a model left anywhere else (the guide warns that ``device_map="auto"`` silently loads on CPU)
  FAILs at ``load`` with basis ``placement``, saying where it is, and is not run.
* Does its output equal the direct path's? Its tokens are checked exactly as the direct path's are: against
  the direct path's free-running CPU reference (the same cached reference the inference row uses, so
  ``reference_match`` says whether the two paths agree) and teacher-forced on CPU. A forward task's pipeline
  (``templates/tasks/forward_pipeline.py``) calls the model's forward instead: its scores are judged by the
  forward rule against the direct path's CPU reference.

It applies to the tasks users reach for a pipeline for (a task row's ``pipeline``: text generation,
image-text-to-text, speech recognition, every forward task). A pipeline runs in one process on one device,
so a model whose plan needs more than one core is SKIPPED at ``plan`` (its inference row shards it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from pytest_neuron_support.base.model import ModelSpec
from pytest_neuron_support.checks.inference import InferenceCheck
from pytest_neuron_support.checks.kind import CpuSide
from pytest_neuron_support.checks.rows import settings_hash
from pytest_neuron_support.data.records import Row
from pytest_neuron_support.run.context import Job
from pytest_neuron_support.run.runscript import RunSpec, TrainSpec
from pytest_neuron_support.run.settings import Settings
from pytest_neuron_support.tasks.table import task_of
from pytest_neuron_support.tasks.task import Task
from pytest_neuron_support.verdict import decide


def placement_arguments(device_map: str) -> dict[str, Any]:
    """How run.py asks the pipeline for the device: ``device=<device>``, the guide's recipe (written into
    ``SPEC["task_options"]["pipeline"]``, so the file shows it)."""
    return {"device": device_map}


class PipelineCheck(InferenceCheck):
    """Does the model run on the device through ``transformers.pipeline``, and say what the direct path says?
    The inference check with the pipeline's loading and call, and the placement guard before its verdict;
    its CPU side is the inference check's (the direct path's free-running reference)."""

    name = "pipeline"
    test = "test_pipeline"
    fixture = "neuron_pipeline_check"
    folder = "pipeline"
    summary = (
        "run.py through transformers.pipeline(task, model=id, device=<device>): the model must sit on the device, "
        "its output checked against the direct path's CPU reference"
    )

    def applies_to(self, task: Task) -> bool:
        return task.pipeline

    def hash_parts(self) -> list[str]:
        return [self.name]

    def planned(self, row: Row, model: ModelSpec, settings: Settings) -> Row:
        row = replace(row, check=self.name, settings_hash=settings_hash(model, settings, self.hash_parts()))
        if row.failure_stage is None and row.neuron_cores is not None and row.neuron_cores > 1:
            return replace(
                row,
                result="SKIPPED",
                failure_stage="plan",
                verdict_basis="plan",
                error=(
                    f"needs {row.neuron_cores} cores, and a pipeline runs in one process on one device; "
                    "its inference row (test_model) shards it"
                ),
            )
        return row

    def device_spec(self, job: Job, post_load: str) -> RunSpec:
        task = task_of(job.model.task)
        spec = task.run_spec(
            job.model, job.settings, device=job.settings.device, reference=False, post_load=post_load, plan=None
        )
        # The pipeline's task is the row's Hub pipeline tag (a CTC row's is automatic-speech-recognition).
        options = {**spec.task_options, "pipeline": placement_arguments(job.settings.device.device_map)}
        options["pipeline_task"] = task.pipeline_tag
        return replace(spec, fragments=task.pipeline_fragments, task_options=options)

    def with_result(self, job: Job, row: Row, result: Mapping[str, Any]) -> Row:
        return replace(
            super().with_result(job, row, result),
            pipeline_class=result.get("pipeline_class"),
            pipeline_device=result.get("pipeline_device"),
            model_devices=tuple(result.get("model_devices") or ()),
            pipeline_text=result.get("pipeline_text"),
        )

    def locate(self, job: Job, row: Row, result: Mapping[str, Any], spec: RunSpec | TrainSpec) -> Row:
        # The module search reruns the direct path's forward: this check's FAILs say where at their own stage.
        return row

    def decide(self, job: Job, row: Row, result: Mapping[str, Any], side: CpuSide) -> Row:
        misplaced = decide.placement(job.settings.device.device_map, row.model_devices, row.pipeline_device)
        if misplaced is not None:
            side.cancel()
            return replace(row, **misplaced.fields())
        return super().decide(job, row, result, side)
