"""Text to image (``text-to-image``): a diffusers pipeline, loaded whole onto the device and its
denoiser compiled with the device's backend, the way diffusers' own Neuron test compiles it.

run.py (``templates/tasks/diffusers.py``, ``templates/tasks/text_to_image.py``) makes the same image
twice from a fixed prompt, seed (on a CPU generator), step count and guidance at the pipeline's own
default resolution: the first call compiles, the second is timed warm, step by step, and must repeat the
first image exactly. Every stage of the first call is recorded (denoiser, guidance combine, scheduler
step, VAE decode), and where each component's parameters ended up (a component not on the device FAILs
at ``load``, basis placement).

The verdict is the **teacher-forced pipeline check**: the same pipeline call on CPU, eager, every stage
fed the device's own inputs (its latent into the denoiser, its prediction into the guidance combine, its
guided noise and latent into the scheduler step, its final latent into the VAE decoder), in float32 and
in the device's dtype, each stage's device output judged by the calibrated tolerance rule
(``verdict.tolerance``). A FAIL names the first stage and step out of tolerance and by how much. A
free-running CPU run from the same seed makes the reference image; the two images' PSNR is kept as
evidence.

The planner reads ``model_index.json`` and each component's safetensors headers (local files, the Hub
cache, else the Hub API): the weights of every component together, on one core (run.py shards no
pipeline).
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

from pytest_neuron_support import hub
from pytest_neuron_support.base.model import DEFAULT_PROMPT, ModelSpec
from pytest_neuron_support.base.storage import write_atomic
from pytest_neuron_support.cpu.reference import ReferenceRun
from pytest_neuron_support.cpu.stages import stages_check, stages_spec
from pytest_neuron_support.data.records import Row
from pytest_neuron_support.planning.planner import (
    ModelShape,
    PlanningError,
    brief,
    count_safetensors_parameters,
    label,
)
from pytest_neuron_support.run.context import DEVICE_RUN, Job
from pytest_neuron_support.tasks.task import Task
from pytest_neuron_support.verdict import decide
from pytest_neuron_support.verdict.images import psnr
from pytest_neuron_support.verdict.tolerance import MULTIPLE, row_fields

#: The prompt of an entry that sets none, while the session's --prompt is the default (a text
#: continuation prompt describes no picture).
IMAGE_PROMPT = "A red apple on a wooden table, studio light"
#: What every run makes: the same image from the same noise, on any device, at the pipeline's own default
#: resolution (its production kernels; the tiny zoo's pipeline defaults to 64x64). No size is asked, so
#: PixArt's resolution binning, which maps a small request to about 1024², has nothing to remap. A few
#: steps exercise the scheduler's loop as a long run does; the checks compare every one of them.
OPTIONS: Mapping[str, Any] = {"steps": 4, "guidance_scale": 5.0, "seed": 0}
#: Component classes that carry no weights (``model_index.json`` names a class for every component).
WEIGHTLESS = ("Tokenizer", "TokenizerFast", "Scheduler", "Processor", "FeatureExtractor", "ImageProcessor")
#: The files a pipeline component's weights may be in, in the order diffusers and transformers look.
WEIGHT_FILES = (
    "diffusion_pytorch_model.safetensors",
    "model.safetensors",
    "diffusion_pytorch_model.fp16.safetensors",
    "model.fp16.safetensors",
)
INDEX_FILES = (
    "diffusion_pytorch_model.safetensors.index.json",
    "model.safetensors.index.json",
    "diffusion_pytorch_model.safetensors.index.fp16.json",
    "model.safetensors.index.fp16.json",
)


def pixels(png_b64: str) -> list[int]:
    """An image's 8-bit RGB values, flat, from its base64 PNG."""
    from PIL import Image

    with Image.open(io.BytesIO(base64.b64decode(png_b64))) as image:
        return list(image.convert("RGB").tobytes())


class TextToImage(Task):
    """``DiffusionPipeline`` from diffusers; the prompt, :data:`OPTIONS`."""

    library: ClassVar[str] = "diffusers"
    auto_class = "DiffusionPipeline"
    # diffusers' AutoPipelineForText2Image families (stable-diffusion, flux, ...): a catalog entry covers one
    # by carrying its name as a tag.
    registry = (
        "diffusers.pipelines.auto_pipeline",
        "AUTO_TEXT2IMAGE_PIPELINES_MAPPING",
    )
    inputs: ClassVar[str] = "text-to-image"
    code = ("text_to_image.py",)
    generates: ClassVar[bool] = False
    # Its inference check already is diffusers' own pipeline (DiffusionPipeline.from_pretrained(...).to(device)).
    pipeline: ClassVar[bool] = False
    trainable: ClassVar[bool] = False  # train.py trains transformers models, not diffusers pipelines
    # Its denoiser's graph is larger than a tiny text model's whole model, runs steps x 2 (guidance) times
    # per call, and the CPU check replays the whole pipeline twice (float32 and the device's dtype):
    # measured on the tiny zoo on cpu, its run took about 3 times a text model's (159 s against 42 to 78 s
    # under the README's main job, fef5295). Started with the text models' prior it began seventh and
    # finished last, alone, a minute after the others.
    prior_factor: ClassVar[float] = 3.0

    def prompt(self, model: ModelSpec, default: str) -> str | None:
        if not model.prompt and default == DEFAULT_PROMPT:
            return IMAGE_PROMPT
        return super().prompt(model, default)

    def hash_parts(self, model: ModelSpec) -> list[str]:
        return [json.dumps(dict(OPTIONS), sort_keys=True)]

    def spec_fields(self, model: ModelSpec, reference: bool) -> dict[str, Any]:
        return {"task_options": dict(OPTIONS)}

    def read_shape(self, model: ModelSpec, *, local_only: bool = False) -> ModelShape:
        return read_pipeline_shape(model, local_only=local_only)

    def with_result(self, row: Row, result: Mapping[str, Any]) -> Row:
        row = super().with_result(row, result)
        steps = [float(s) for s in result.get("step_s") or ()]
        return replace(row, denoise_step_s=round(sum(steps) / len(steps), 4) if steps else None)

    def repeat(self, row: Row, result: Mapping[str, Any]) -> decide.Decision | None:
        if row.repeat_identical is not False:
            return None
        return decide.repeat_differs((), None, None, outputs="image")

    def free_reference(self, sharded: bool) -> bool:
        return True  # its image is the one the device's is compared with

    def compare(self, row: Row, model: ModelSpec, result: Mapping[str, Any], reference: Mapping[str, Any]) -> Row:
        device, cpu = result.get("image_png"), reference.get("image_png")
        found = psnr(pixels(device), pixels(cpu)) if device and cpu else None
        return replace(row, image_psnr=found)

    def decide(self, job: Job, row: Row, result: Mapping[str, Any], reference: ReferenceRun | None) -> Row:
        assert reference is not None
        misplaced = decide.component_placement(job.settings.device.device_map, result.get("component_devices") or {})
        if misplaced is not None:
            return replace(row, **misplaced.fields())
        row, cpu = self.reference_of(row, result, reference)
        if cpu is None:
            return row
        row = self.compare(row, job.model, result, cpu)
        if result.get("image"):
            row = replace(row, image=job.in_results(job.workdir / DEVICE_RUN / str(result["image"])))
        png = cpu.get("image_png")
        if png:  # the CPU's image beside the device's, cached or not
            image = write_atomic(job.workdir / "reference" / "image.png", base64.b64decode(png))
            row = replace(row, reference_image=job.in_results(image))
        # The teacher-forced check: the device's recording through the CPU pipeline, stage by stage, in float32
        # and in the device's dtype (the dtype's own noise the device's distance is judged against).
        recording = job.workdir / DEVICE_RUN / str(result.get("denoiser_io") or "denoiser_io.pt")
        checked = stages_check(job, stages_spec(reference.spec, recording, job.model.dtype), row.parameters)
        row = replace(row, cpu_check=checked.how, cpu_check_s=checked.wall_s)
        if checked.evidence is not None:
            row = replace(row, **row_fields(checked.evidence))
        return replace(row, **decide.pipeline_stages(checked.evidence, checked.how, checked.failure).fields())

    def locate_options(self, row: Row, result: Mapping[str, Any]) -> Mapping[str, Any] | str | None:
        """The first stage out of tolerance, where it is a module's: a denoise step is searched in the denoiser
        fed that call's recorded inputs, the decode in the VAE fed the recorded final latent. The guidance combine
        and the scheduler step are the pipeline's own arithmetic, not modules: their stage and step name them."""
        stage, step = row.evidence_stage, row.evidence_step
        if row.noise_ratio is None or row.noise_ratio <= MULTIPLE:
            # A FAIL with no comparison out of tolerance (the calls did not pair up): no step to search.
            return "no stage of the teacher-forced check was out of tolerance, so there is no step to search"
        recording = str(result.get("denoiser_io") or "denoiser_io.pt")
        if stage == "denoise" and step is not None:
            return {"component": str(result.get("denoiser") or "unet"), "call": int(step), "recording": recording}
        if stage == "decode":
            return {"component": "vae", "call": 0, "recording": recording}
        return (
            f"the {stage} stage is the pipeline's own arithmetic, not a module (its stage and step name where the "
            "device went wrong)"
        )


def read_pipeline_shape(model: ModelSpec, *, local_only: bool = False) -> ModelShape:
    """A pipeline's facts for the planner: ``model_index.json``'s class and the weights of every component
    (their safetensors headers: local files, the Hub cache, else the Hub API). No weight is downloaded."""
    if model.source == "local":
        directory = Path(model.id)
        index = _read_index(directory / "model_index.json", model)
        return _pipeline_shape(model, index, lambda name: _existing(directory / name), None, "local files")
    try:
        path = hub.download_file(model.id, "model_index.json", revision=model.revision, local_only=local_only)
    except Exception as exc:  # the Hub raises many types here; each means the same to the planner
        error = PlanningError(
            f"cannot inspect {label(model)}: model_index.json is neither in the Hugging Face cache nor "
            f"downloadable: {brief(exc)}"
        )
        error.unreachable = hub.is_unreachable(exc)
        raise error from exc
    index = _read_index(path, model)

    def cached(name: str) -> Path | None:
        return hub.cached_file(model.id, name, revision=model.revision)

    try:
        return _pipeline_shape(model, index, cached, None, "hub cache")
    except PlanningError:
        if local_only:
            raise
    files = set(hub.repo_files(model.id, revision=model.revision))
    return _pipeline_shape(model, index, lambda name: Path(name) if name in files else None, files, "hub api")


def _existing(path: Path) -> Path | None:
    return path if path.is_file() else None


def _read_index(path: Path, model: ModelSpec) -> dict[str, Any]:
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlanningError(f"cannot inspect {label(model)}: cannot read {path}: {exc}") from exc
    if not isinstance(index, dict) or not isinstance(index.get("_class_name"), str):
        raise PlanningError(f"cannot inspect {label(model)}: {path} names no pipeline class (_class_name)")
    return index


def _pipeline_shape(
    model: ModelSpec,
    index: Mapping[str, Any],
    find: Callable[[str], Path | None],
    hub_files: set[str] | None,
    source: str,
) -> ModelShape:
    """``find`` locates a repository file (None when absent); ``hub_files``, when set, means the files are
    on the Hub and their headers are read through its API."""
    total = 0
    for component in weighted_components(index):
        files = _component_files(model, component, find)
        if not files:
            raise PlanningError(f"cannot inspect {label(model)}: the weights of {component} are not in the {source}")
        try:
            if hub_files is None:
                total += count_safetensors_parameters(files)
            else:
                total += sum(
                    hub.safetensors_file_parameters(model.id, str(name), revision=model.revision) for name in files
                )
        except Exception as exc:  # a corrupt header, the Hub's answer
            raise PlanningError(f"cannot inspect {label(model)}: {component}: {brief(exc)}") from exc
    if total == 0:
        raise PlanningError(f"cannot inspect {label(model)}: model_index.json names no component with weights")
    return ModelShape(
        model_type=str(index["_class_name"]),
        num_attention_heads=0,
        num_key_value_heads=0,
        num_experts=0,
        has_tp_plan=False,
        parameters=total,
        weights_source=source,
    )


def weighted_components(index: Mapping[str, Any]) -> list[str]:
    """The components of a ``model_index.json`` that hold weights: those with a library and a class that is
    no tokenizer, scheduler or processor (an absent optional component is ``[null, null]``)."""
    return [
        name
        for name, value in index.items()
        if not name.startswith("_")
        and isinstance(value, list)
        and len(value) == 2
        and value[0] is not None
        and isinstance(value[1], str)
        and not value[1].endswith(WEIGHTLESS)
    ]


def _component_files(model: ModelSpec, component: str, find: Callable[[str], Path | None]) -> list[Path] | None:
    """The safetensors files of one component, or None (or none) when they are not all found there."""
    for name in INDEX_FILES:
        index = find(f"{component}/{name}")
        if index is None:
            continue
        if not index.is_file():  # on the Hub: its shards are read from the index there
            index = hub.download_file(model.id, f"{component}/{name}", revision=model.revision)
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        found = [find(f"{component}/{shard}") for shard in shards]
        return None if any(path is None for path in found) else [path for path in found if path is not None]
    for name in WEIGHT_FILES:
        path = find(f"{component}/{name}")
        if path is not None:
            return [path]
    return None
