"""The session's settings (one frozen object, fixed at configure time) and what follows from them
alone: the core pool, a model's run folder name, its prompt and cosine threshold, the settings hash
--resume compares, and the host's doctor self-check.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from pytest_neuron_support.catalog.load import DEFAULT_PROMPT, ModelSpec
from pytest_neuron_support.data.records import Stack
from pytest_neuron_support.planning.planner import DEFAULT_HEADROOM, DEFAULT_MAX_CORES
from pytest_neuron_support.run.cores import CorePool, neuron_owners
from pytest_neuron_support.run.devices import DeviceKind
from pytest_neuron_support.run.runscript import TEST_CARD_SIZE
from pytest_neuron_support.verdict.checks import (
    DEFAULT_JUDGE,
    DEFAULT_MIN_COSINE,
    EMBEDDING_SENTENCES,
    TRAIN_BATCH,
    TRAIN_LEARNING_RATE,
    TRAIN_MAX_LENGTH,
    TRAIN_STEPS,
    TRAIN_TEXTS,
)


@dataclass(frozen=True)
class Settings:
    """Session-wide choices, fixed at configure time.

    Attributes:
        device: the device kind runs use.
        pool_cores: most cores this session holds at once (``--neuron-cores``).
        pool_slice: the host cores it may lease (its slice, in the host's numbering).
        session: its id in the host-wide core ledger.
        max_new_tokens: greedy tokens per run.
        prompt: default prompt (catalog entries may set their own).
        model_timeout: seconds each run.py process may take before its group is killed.
        results_dir: dataset root (Parquet under ``data/``, run artifacts under ``runs/``).
        compile_backend: torch.compile backend for device runs (the device's by default).
        reference_dtype: dtype of the CPU reference, None = the device run's dtype.
        allow_remote_code: the user opted in to Hub repository code (--allow-remote-code).
        stack: versions of the installed stack.
        core_bytes: memory of one core the planner fills (device-reported or --core-memory-gib).
        headroom: fraction of each core kept free of weights (--memory-headroom).
        max_cores: most cores one model may use (--max-cores).
        lease_dir: directory of the host-wide core ledger (every session on the host shares it).
        judge_model: Hub id (or local path) of the model that judges sharded runs' fluency.
        judge_revision: its revision.
        parity: ``exact`` (every token equal) or ``near-tie`` (a near-tie first divergence passes).
        reference_cache: directory of cached CPU reference results, None to always rerun them.
        compile_cache: directory for the device's compile cache (NEFF cache on neuron, inductor's
            FX graph cache elsewhere), None to leave the environment's choice.
        host_memory_limit: address-space cap (bytes) of every run.py process, None for none.
        cpu_check_memory: host memory (bytes) the teacher-forced CPU check of a sharded run may
            take, None for what the host has available when it starts (--cpu-check-memory-gib).
        self_check: the host's doctor self-check for this device (``results_dir/doctor.json``), as
            every row records it; None when none was run.
        hub_unreachable: why the session found the Hub unreachable before planning (``hub.unreachable``,
            e.g. ``http://host:port is unreachable (Connection refused)``), None when it answered or was
            not asked (``HF_HUB_OFFLINE=1`` set by the user is not this: the runs inherit it anyway).
            When set, every process the session starts for a model runs with ``HF_HUB_OFFLINE=1``
            (``pipeline.session_env``) and a load failure says why in one line.
        cpu_threads: OMP_NUM_THREADS of every process the session runs for a model (``--cpu-threads``,
            ``controller.resolve_cpu_threads``), None to leave the environment's as it is.
    """

    device: DeviceKind
    pool_cores: int
    max_new_tokens: int
    prompt: str
    model_timeout: float
    results_dir: Path
    compile_backend: str
    reference_dtype: str | None
    allow_remote_code: bool
    stack: Stack
    core_bytes: int = 24 << 30
    headroom: float = DEFAULT_HEADROOM
    max_cores: int = DEFAULT_MAX_CORES
    lease_dir: Path | None = None
    judge_model: str = DEFAULT_JUDGE
    judge_revision: str = "main"
    parity: str = "exact"
    reference_cache: Path | None = None
    compile_cache: Path | None = None
    host_memory_limit: int | None = None
    cpu_check_memory: int | None = None
    pool_slice: tuple[int, ...] = ()
    session: str = ""
    self_check: str | None = None
    hub_unreachable: str | None = None
    cpu_threads: int | None = None


def core_pool(settings: Settings) -> CorePool:
    """The session's view of the host-wide core ledger: its slice, its cap, the device's owners."""
    assert settings.lease_dir is not None
    command = settings.device.owners_command
    return CorePool(
        settings.lease_dir,
        settings.pool_slice or settings.pool_cores,
        limit=settings.pool_cores,
        session=settings.session or None,
        device=settings.device.name,
        owners=None if command is None else neuron_owners(command),
    )


def slug(model_id: str) -> str:
    """A directory name for a model id or local path."""
    return re.sub(r"[^A-Za-z0-9._-]+", "--", model_id.strip("/")) or "model"


def run_dir(results_dir: Path, device: str, model_id: str) -> Path:
    """A catalog model's run folder on ``device``: its run.py, result and log, per run kind
    (``device``, ``reference``, ``cpu-check``, ``judge``; the training check's under ``train``)."""
    return results_dir / "runs" / slug(model_id) / device


#: The text turn after the image of an image-text-to-text entry that sets no prompt, while the
#: session's --prompt is the default (a text continuation prompt says nothing about an image).
IMAGE_PROMPT = "Describe this image."


#: (width, height) of the test card run.py draws for image-text-to-text runs.
IMAGE_SIZE: tuple[int, int] = TEST_CARD_SIZE


def prompt_of(model: ModelSpec, settings: Settings) -> str | None:
    """The prompt a model's runs use; None for embedding tasks, which embed fixed sentences."""
    if model.embedding:
        return None
    if model.prompt:
        return model.prompt
    if model.task == "image-text-to-text" and settings.prompt == DEFAULT_PROMPT:
        return IMAGE_PROMPT
    return settings.prompt


def min_cosine_of(model: ModelSpec) -> float:
    """The cosine threshold of an embedding task: the entry's ``min_cosine``, else the default."""
    return DEFAULT_MIN_COSINE if model.min_cosine is None else model.min_cosine


def timeout_of(model: ModelSpec, settings: Settings) -> float:
    """Seconds each of ``model``'s run.py processes may take: the entry's ``timeout``, else
    ``--model-timeout``."""
    return settings.model_timeout if model.timeout is None else model.timeout


def settings_hash(model: ModelSpec, settings: Settings, check: str = "inference") -> str:
    """What makes two rows of one model on one stack comparable: a rerun with the same hash
    would repeat the same check (``--resume`` skips it)."""
    parts = [
        model.id,
        model.revision,
        model.task,
        model.dtype,
        str(prompt_of(model, settings)),
        str(model.cores),
        str(settings.max_new_tokens),
        settings.device.name,
        settings.compile_backend,
        str(settings.reference_dtype),
        settings.parity,
        settings.judge_model,
        settings.judge_revision,
        str(settings.core_bytes),
        str(settings.headroom),
        str(settings.max_cores),
    ]
    if model.embedding:
        parts += [repr(min_cosine_of(model)), *EMBEDDING_SENTENCES]
    if check != "inference":
        # The training check's own settings (its rows never stand for an inference row, nor back).
        parts += [check, *map(repr, (TRAIN_STEPS, TRAIN_BATCH, TRAIN_MAX_LENGTH, TRAIN_LEARNING_RATE)), *TRAIN_TEXTS]
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:16]


def read_self_check(results_dir: Path, device: str) -> str | None:
    """What ``neuron-support doctor --json <results>/doctor.json`` found for ``device``, as a row keeps
    it; None when there is no such file, it is unreadable, or it checked another device."""
    try:
        data = json.loads((results_dir / "doctor.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("device") != device:
        return None
    verdict = "passed" if data.get("passed") else "FAILED"
    return f"{verdict}: {data.get('summary')} at {data.get('timestamp')}"
