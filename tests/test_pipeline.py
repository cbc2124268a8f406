"""The pipeline check (``check: pipeline``): the tiny zoo's models through ``transformers.pipeline(task,
model=id, device=<device>)`` as users run the plugin, a pipeline whose model stays on CPU, and the plan
a pipeline cannot take."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from faultkit import assert_outcomes
from test_devices import settings_on

from pytest_neuron_support import zoo
from pytest_neuron_support.base.model import ModelSpec
from pytest_neuron_support.checks.pipeline import PipelineCheck
from pytest_neuron_support.checks.registry import KINDS, checks_of
from pytest_neuron_support.checks.rows import planned_row
from pytest_neuron_support.checks.run import run_check
from pytest_neuron_support.planning.planner import Plan
from pytest_neuron_support.run.context import Job
from pytest_neuron_support.run.runscript import RunSpec
from pytest_neuron_support.tasks.table import TASKS

LLAMA, LLAVA, WHISPER = "tiny-random/llama", "tiny-random/llava", zoo.WHISPER_REPO
ONE_CORE = Plan(cores=1, tp_size=1, ep_size=1, weight_bytes=1 << 20, skip=None, reason="fits one core")
#: A cuda lease of a GPU index no host has: the run's CUDA_VISIBLE_DEVICES names it, so torch sees no CUDA
#: device on any host, one with GPUs included (an index past the last GPU hides it and every one after it).
NO_SUCH_GPU = 4096


@pytest.mark.usefixtures("offline_hub", "eager_compile", "shared_references")
@pytest.mark.slow
def test_pipelines_put_the_model_on_the_device_and_say_what_the_direct_path_says(pytester: pytest.Pytester) -> None:
    entries = "".join(
        f"  - {{id: {model}, task: {task}, checks: [inference, pipeline]}}\n"
        for model, task in (
            (LLAMA, "text-generation"),
            (LLAVA, "image-text-to-text"),
            (WHISPER, "automatic-speech-recognition"),
        )
    )
    pytester.makefile(".yaml", models=f"models:\n{entries}")
    # `-k pipeline` selects the test_pipeline[<id>] items, not the inference items of the same entries.
    result = pytester.runpytest_subprocess("--device=cpu", "-n", "2", "--results-dir=out", "-k", "pipeline")
    assert_outcomes(result, pytester.path / "out", passed=3)
    df = pd.read_parquet(pytester.path / "out" / "data").set_index("model_id")
    assert set(df.check) == {"pipeline"} and len(df) == 3
    for model, pipeline_class in (
        (LLAMA, "TextGenerationPipeline"),
        (LLAVA, "ImageTextToTextPipeline"),
        (WHISPER, "AutomaticSpeechRecognitionPipeline"),
    ):
        row = df.loc[model]
        assert (row.result, row.verdict_basis, row.pipeline_class) == ("PASS", "parity+teacher-forced", pipeline_class)
        # On the device (here the cpu row) as asked, and the direct path's tokens, token for token.
        assert list(row.model_devices) == ["cpu"] and row.pipeline_device == "cpu"
        assert row.reference_match and row.matched_prefix == len(row.tokens) > 0
        # The same tokens as the direct path's CPU reference: its own teacher-forced pass is this row's check.
        assert row.cpu_check == "reused" and row.positions_checked == len(row.tokens)
        assert row.text.strip() and row.text.strip() in row.pipeline_text and row.repeat_identical
        assert "transformers.pipeline(" in row.runscript and "'pipeline': {'device': 'cpu'}" in row.runscript
        assert "from_pretrained" not in row.runscript.split("def load(", 1)[1].split("\ndef ", 1)[0]


@pytest.mark.usefixtures("offline_hub")
@pytest.mark.slow
def test_a_model_a_post_load_hook_moves_off_the_cpu_device_fails_at_placement(tmp_path: Path) -> None:
    """The counterpart of the cpu row's ``model_devices == ["cpu"]`` above, which alone could not fail on
    ``--device=cpu`` (every tensor is on the CPU unless something moves it). The session's post-load hook
    (``pytest_neuron_support_post_load``'s code) moves the final norm to the ``meta`` device, which every
    host has: where the model is when it runs is read after the hook, so the check FAILs it at ``load`` on
    its placement, naming both device types, and does not run it."""
    settings = settings_on("cpu", results_dir=tmp_path / "out", model_timeout=300.0)
    moved = "model.model.norm.to('meta')\n"
    row = run_check(PipelineCheck(), ModelSpec(id=LLAMA), settings, ONE_CORE, post_load=moved)
    assert (row.result, row.failure_stage, row.verdict_basis, row.check) == ("FAIL", "load", "placement", "pipeline")
    assert row.model_devices == ("cpu", "meta") and row.pipeline_device == "cpu"
    assert "the pipeline's model is on cpu, meta, not on cpu" in (row.error or ""), row.error
    assert row.tokens == () and row.reference_match is None


@pytest.mark.usefixtures("offline_hub")
@pytest.mark.slow
def test_a_pipeline_whose_model_stays_on_cpu_fails_and_says_so(tmp_path: Path) -> None:
    """The guide's trap, planted: a pipeline asked for ``device_map="auto"`` on a cuda session of a machine
    without CUDA, where Accelerate finds no GPU and silently loads onto the CPU. The real run.py runs (in
    its own process) and the pipeline does run; the check must FAIL it at ``load`` and say where the model is.
    The absence of CUDA holds on any host: the lease names a GPU no host has (:data:`NO_SUCH_GPU`), so the run's
    ``CUDA_VISIBLE_DEVICES`` hides every GPU a host has."""

    class AutoPlacedPipeline(PipelineCheck):
        def device_spec(self, job: Job, post_load: str) -> RunSpec:
            spec = super().device_spec(job, post_load)
            return replace(spec, task_options={**spec.task_options, "pipeline": {"device_map": "auto"}})

    settings = settings_on("cuda", results_dir=tmp_path / "out", model_timeout=300.0)
    no_gpu = (NO_SUCH_GPU, 1)
    assert settings.device.pin_cores(*no_gpu) == {"CUDA_VISIBLE_DEVICES": str(NO_SUCH_GPU)}
    row = run_check(AutoPlacedPipeline(), ModelSpec(id=LLAMA), settings, ONE_CORE, cores=no_gpu)
    assert (row.result, row.failure_stage, row.verdict_basis, row.check) == ("FAIL", "load", "placement", "pipeline")
    assert row.model_devices == ("cpu",) and row.pipeline_device == "cpu"
    assert "the pipeline's model stayed on cpu, not on cuda" in (row.error or "")
    assert "'pipeline': {'device_map': 'auto'}" in (row.runscript or "")
    # Not run: nothing was generated off the device to be compared.
    assert row.tokens == () and row.reference_match is None

    # The same check as shipped asks for the device itself, which a machine without CUDA cannot give: an
    # ERROR at load (the pipeline raised), never a PASS on the CPU.
    shipped = run_check(PipelineCheck(), ModelSpec(id=LLAMA), settings, ONE_CORE, cores=no_gpu)
    assert (shipped.result, shipped.failure_stage) == ("ERROR", "load"), shipped.error
    assert "'pipeline': {'device': 'cuda'}" in (shipped.runscript or "")


def test_the_pipeline_check_applies_to_the_tasks_users_run_pipelines_for_on_one_core() -> None:
    kind = KINDS["pipeline"]
    assert {name for name, task in TASKS.items() if kind.applies_to(task)} == {
        "text-generation",
        "image-text-to-text",
        "automatic-speech-recognition",
        # The forward tasks' pipelines call the model's forward (templates/tasks/forward_pipeline.py).
        "text-classification",
        "zero-shot-classification",
        "token-classification",
        "fill-mask",
        "image-classification",
        "audio-classification",
        "automatic-speech-recognition-ctc",
        "zero-shot-image-classification",
        "image-feature-extraction",
        "depth-estimation",
        "object-detection",
        "image-segmentation",
    }
    assert checks_of(ModelSpec(id="m", task="sentence-similarity"), ["inference", "pipeline"]) == ("inference",)
    settings = settings_on("cpu", neuron_cores=16)
    model = ModelSpec(id="org/big")
    four = Plan(cores=4, tp_size=4, ep_size=1, weight_bytes=40 << 30, skip=None, reason="tp over 4 cores")
    row = kind.planned(planned_row(model, settings, four), model, settings)
    assert (row.result, row.failure_stage, row.check) == ("SKIPPED", "plan", "pipeline")
    assert "a pipeline runs in one process on one device" in (row.error or "")
    one = kind.planned(planned_row(model, settings, ONE_CORE), model, settings)
    assert one.failure_stage is None and one.check == "pipeline"
    # Its rows never stand for the inference row's (--resume tells them apart).
    assert one.settings_hash != planned_row(model, settings, ONE_CORE).settings_hash
