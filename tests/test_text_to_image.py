"""Text to image through the plugin as users run it: the tiny zoo's Stable Diffusion pipeline (diffusers,
built offline from the real component configs), its teacher-forced denoising verdict, a fault planted in
one denoising step, and the planner's reading of a pipeline repository."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import huggingface_hub.constants
import pandas as pd
import pytest
from faultkit import assert_outcomes

from pytest_neuron_support import zoo
from pytest_neuron_support.base.model import ModelSpec
from pytest_neuron_support.base.storage import slug
from pytest_neuron_support.planning.planner import PlanningError, count_safetensors_parameters
from pytest_neuron_support.tasks.text_to_image import read_pipeline_shape, weighted_components
from pytest_neuron_support.verdict.denoising import MAX_REL_ERROR

PIPELINE = zoo.PIPELINE_REPO
#: The same pipeline under another id, so one session can run it clean and with a planted fault.
PLANTED = "planted/stable-diffusion"


def _snapshot(cache: Path, repo: str) -> Path:
    return next((cache / f"models--{repo.replace('/', '--')}" / "snapshots").iterdir())


def pipeline_timesteps(snapshot: Path) -> list[int]:
    """The timestep of each denoiser call of a 4-step run (the scheduler's own list: PNDM repeats one)."""
    from diffusers import PNDMScheduler

    scheduler = PNDMScheduler.from_pretrained(snapshot / "scheduler")
    scheduler.set_timesteps(4)
    return [int(t) for t in scheduler.timesteps]


@pytest.fixture
def pipeline_hub(offline_hub: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private copy of the zoo cache holding the tiny pipeline under its own id and a second id."""
    cache = tmp_path / "hub"
    shutil.copytree(offline_hub, cache, symlinks=True)
    zoo.install_snapshot(cache, PLANTED, _snapshot(cache, PIPELINE))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


@pytest.fixture
def zoo_cache_in_process(offline_hub: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """offline_hub's zoo cache for this process's huggingface_hub too (the planner reads it in-process).
    huggingface_hub read its cache folder at import (conftest), before offline_hub set HF_HUB_CACHE for
    the subprocesses; on a fresh machine that default cache is empty."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(offline_hub))


def test_the_tiny_pipeline_passes_and_a_fault_in_one_denoising_step_fails_at_that_step(
    pytester: pytest.Pytester, pipeline_hub: Path
) -> None:
    calls = pipeline_timesteps(_snapshot(pipeline_hub, PIPELINE))
    # The fault: on the device only (the post-load hook), the noise prediction of the one call whose
    # timestep appears once is scaled by 1.5, in both pipeline calls alike (the warm run repeats it).
    step = next(i for i, t in enumerate(calls) if calls.count(t) == 1 and i > 0)
    pytester.makeconftest(
        f"""
def pytest_neuron_support_post_load(config, model):
    if model.id != {PLANTED!r}:
        return None
    return (
        "def planted(module, args, kwargs, output):\\n"
        "    timestep = args[1] if len(args) > 1 else kwargs['timestep']\\n"
        "    hit = (torch.as_tensor(timestep) == {calls[step]}).to(output[0].dtype)\\n"
        "    return (output[0] * (1 + 0.5 * hit), *output[1:])\\n"
        "model.unet.register_forward_hook(planted, with_kwargs=True)\\n"
    )
"""
    )
    pytester.makefile(
        ".yaml",
        models=f"models:\n  - {{id: {PIPELINE}, task: text-to-image}}\n  - {{id: {PLANTED}, task: text-to-image}}\n",
    )
    result = pytester.runpytest_subprocess("--device=cpu", "-n", "2", "--results-dir=out", "--reference-cache=none")
    assert_outcomes(result, pytester.path / "out", passed=1, failed=1)
    df = pd.read_parquet(pytester.path / "out" / "data").set_index("model_id")

    clean = df.loc[PIPELINE]
    assert (clean.result, clean.task, clean.verdict_basis) == ("PASS", "text-to-image", "denoise-teacher-forced")
    assert clean.denoise_steps_checked == len(calls) and clean.reference_match
    assert (clean.denoise_rel_errors <= MAX_REL_ERROR).all() and clean.denoise_max_rel_error <= MAX_REL_ERROR
    assert clean.graphs_compiled >= 1 and clean.recompiles == 0 and clean.repeat_identical
    assert clean.compile_s > 0 and clean.denoise_step_s > 0 and clean.image_psnr > 20
    assert "torch.compile(" in clean.runscript and "fullgraph=True" in clean.runscript
    assert "'auto_class': 'DiffusionPipeline'" in clean.runscript and "def run_generation(" not in clean.runscript
    assert pd.isna(clean.max_new_tokens) and len(clean.tokens) == 0

    planted = df.loc[PLANTED]
    assert (planted.result, planted.failure_stage, planted.verdict_basis) == (
        "FAIL",
        "parity",
        "denoise-teacher-forced",
    )
    assert planted.denoise_first_bad_step == step and not planted.reference_match
    # Only the planted step is off, by what was planted: half the prediction.
    assert (planted.denoise_rel_errors > MAX_REL_ERROR).tolist() == [i == step for i in range(len(calls))]
    assert 0.45 < planted.denoise_rel_errors[step] < 0.55
    assert (
        f"step {step} of {len(calls)} is out of tolerance" in planted.error and "relative error 0.49" in planted.error
    )
    assert "model.unet.register_forward_hook(planted" in planted.runscript

    # Both images are beside their runs, and each row names them.
    for model, row in ((PIPELINE, clean), (PLANTED, planted)):
        runs = pytester.path / "out" / "runs" / slug(model) / "cpu"
        assert (pytester.path / "out" / row.image).samefile(runs / "device" / "image.png")
        assert (pytester.path / "out" / row.reference_image).samefile(runs / "reference" / "image.png")
        device = json.loads((runs / "device" / "result.json").read_text())
        assert device["denoiser"] == "unet" and device["denoiser_calls"] == len(calls)


@pytest.mark.usefixtures("zoo_cache_in_process")
def test_the_planner_reads_a_pipeline_from_its_components_headers(offline_hub: Path, tmp_path: Path) -> None:
    snapshot = _snapshot(offline_hub, PIPELINE)
    index = json.loads((snapshot / "model_index.json").read_text())
    assert weighted_components(index) == ["text_encoder", "unet", "vae"]
    expected = sum(
        count_safetensors_parameters([path])
        for path in (
            snapshot / "unet" / "diffusion_pytorch_model.safetensors",
            snapshot / "vae" / "diffusion_pytorch_model.safetensors",
            snapshot / "text_encoder" / "model.safetensors",
        )
    )
    cached = read_pipeline_shape(ModelSpec(id=PIPELINE, task="text-to-image"), local_only=True)
    assert (cached.parameters, cached.weights_source, cached.model_type) == (
        expected,
        "hub cache",
        "StableDiffusionPipeline",
    )
    assert not cached.has_tp_plan  # the planner gives a pipeline one core, or skips it
    local = tmp_path / "pipeline"
    shutil.copytree(snapshot, local)
    shape = read_pipeline_shape(ModelSpec(id=str(local), task="text-to-image", source="local"))
    assert (shape.parameters, shape.weights_source) == (expected, "local files")
    # A component whose weights are gone is an error naming it, never a smaller count.
    (local / "vae" / "diffusion_pytorch_model.safetensors").unlink()
    with pytest.raises(PlanningError, match="the weights of vae are not in the local files"):
        read_pipeline_shape(ModelSpec(id=str(local), task="text-to-image", source="local"))


@pytest.mark.usefixtures("zoo_cache_in_process")
def test_the_planner_reads_a_pipeline_through_the_hub_api(offline_hub: Path, tmp_path: Path) -> None:
    # The tiny pipeline's files served by the loopback Hub (tests/hubserver.py), nothing cached: the planner
    # reads model_index.json, lists the repository and reads each component's safetensors header with Range
    # requests, downloading no weight. The real client binds its endpoint at import: a fresh interpreter.
    import os
    import subprocess
    import sys

    from hubserver import HubServer, ModelRecord

    snapshot = _snapshot(offline_hub, PIPELINE)
    files = {p.relative_to(snapshot).as_posix(): p.read_bytes() for p in snapshot.rglob("*") if p.is_file()}
    record = ModelRecord(id="org/tiny-sd", pipeline_tag="text-to-image", library_name="diffusers", files=files)
    code = (
        "import dataclasses, json, sys\n"
        "from pytest_neuron_support.base.model import ModelSpec\n"
        "from pytest_neuron_support.tasks.text_to_image import read_pipeline_shape\n"
        "shape = read_pipeline_shape(ModelSpec(id=sys.argv[1], task='text-to-image'))\n"
        "print(json.dumps(dataclasses.asdict(shape)))\n"
    )
    with HubServer([record]) as server:
        env = {**os.environ, **server.env(), "HF_HUB_CACHE": str(tmp_path / "hub")}
        env.pop("TRANSFORMERS_OFFLINE", None)
        done = subprocess.run(
            [sys.executable, "-c", code, record.id], env=env, capture_output=True, text=True, check=False
        )
        asked = list(server.requests)
    assert done.returncode == 0, done.stderr[-3000:]
    shape = json.loads(done.stdout.strip().splitlines()[-1])
    local = read_pipeline_shape(ModelSpec(id=PIPELINE, task="text-to-image"), local_only=True)
    assert (shape["parameters"], shape["weights_source"]) == (local.parameters, "hub api")
    # Every weights file was read by its header only (a Range request), never downloaded whole.
    weights = [r for r in asked if r.path.endswith(".safetensors") and r.method == "GET"]
    assert weights and all(r.headers.get("range") for r in weights)
