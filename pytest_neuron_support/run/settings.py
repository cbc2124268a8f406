"""The session's settings (one frozen object, fixed at configure time) and what follows from them
alone: the core pool, a model's run folder name, its timeout, and the host's doctor self-check.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_neuron_support.base.model import ModelSpec
from pytest_neuron_support.base.storage import slug
from pytest_neuron_support.data.records import Stack
from pytest_neuron_support.devices.table import DeviceKind
from pytest_neuron_support.planning.planner import DEFAULT_HEADROOM, DEFAULT_MAX_CORES, GIB
from pytest_neuron_support.run.cores import CorePool, neuron_owners
from pytest_neuron_support.verdict.fluency import DEFAULT_JUDGE


@dataclass(frozen=True)
class Resolved:
    """What the controller finds out once and hands to every xdist worker (``workerinput``): the facts the
    settings are made of besides the options (``session.resolve.settings_for``).

    Attributes:
        device: the device kind runs use (``--device``, ``auto`` resolved).
        cores: the host cores this session may lease (its slice, host numbering).
        neuron_cores: most cores it holds at once (``--neuron-cores``, default the whole slice).
        core_bytes: memory of one core the planner fills (the device's figure, or ``--core-memory-gib``).
        neuronx_cc: the device compiler's version (its own ``__version__``), ``none`` off Trainium.
        session: this session's id in the host-wide core ledger.
        self_check: the host's doctor self-check of this device found in the results folder, or None.
        hub_unreachable: why the Hub was found unreachable when the controller planned (set by
            ``session.items.plan_models``), None when it answered; the workers' settings carry it, so
            their runs are offline too.
        cpu_threads: the intra-op CPU threads of every process run for a model
            (``session.resolve.resolve_cpu_threads``), None to leave the environment's OMP_NUM_THREADS.
    """

    device: str
    cores: tuple[int, ...]
    neuron_cores: int
    core_bytes: int
    neuronx_cc: str
    session: str
    self_check: str | None = None
    hub_unreachable: str | None = None
    cpu_threads: int | None = None

    def to_workerinput(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "cores": list(self.cores)}

    @classmethod
    def from_workerinput(cls, data: dict[str, Any]) -> Resolved:
        return cls(**{**data, "cores": tuple(data["cores"])})


#: The field metadata key that declares a setting as one that changes a check's result: its value is the
#: setting's place in the settings hash (``checks.rows.settings_hash``, which ``--resume`` compares), so the
#: hash of every dataset written before the declaration stays what it was.
CHANGES_RESULT = "changes_result"


def result_settings(settings: Settings) -> list[str]:
    """The values of every setting declared to change a result, in their hash order, as text (a device by
    its kind's name). What is not declared (where results are written, timeouts, caches, threads, memory
    caps) leaves a row's settings hash alone: a rerun with another of those repeats the same check."""
    declared = sorted(
        (f.metadata[CHANGES_RESULT], f.name) for f in dataclasses.fields(Settings) if CHANGES_RESULT in f.metadata
    )
    values = []
    for _, name in declared:
        value = getattr(settings, name)
        values.append(value.name if isinstance(value, DeviceKind) else str(value))
    return values


@dataclass(frozen=True)
class Settings:
    """Session-wide choices, fixed at configure time. A field named like a command-line option holds
    that option's value as the session uses it (``session.resolve.settings_for`` copies every field by
    name from the options and the :class:`Resolved` facts): one name from the command line to the row.

    Attributes:
        device: the device kind runs use (``--device``).
        neuron_cores: most cores this session holds at once (``--neuron-cores``).
        cores: the host cores it may lease (its slice, in the host's numbering).
        session: its id in the host-wide core ledger.
        max_new_tokens: greedy tokens per run (``--max-new-tokens``).
        prompt: default prompt (``--prompt``; catalog entries may set their own).
        model_timeout: seconds each run.py process may take before its group is killed.
        results_dir: dataset root (Parquet under ``data/``, run artifacts under ``runs/``).
        compile_backend: torch.compile backend for device runs (the device's by default).
        reference_dtype: dtype of the CPU reference, None = the device run's dtype.
        allow_remote_code: the user opted in to Hub repository code (``--allow-remote-code``).
        stack: versions of the installed stack.
        core_bytes: memory of one core the planner fills (device-reported or ``--core-memory-gib``).
        memory_headroom: fraction of each core kept free of weights (``--memory-headroom``).
        max_cores: most cores one model may use (``--max-cores``).
        core_ledger: directory of the host-wide core ledger (every session on the host shares it).
        judge_model: Hub id (or local path) of the model that judges sharded runs' fluency.
        judge_revision: its revision.
        parity: ``exact`` (every token equal) or ``near-tie`` (a near-tie first divergence passes).
        reference_cache: directory of cached CPU reference results, None to always rerun them.
        neff_cache: the base directory of the device's compile cache (``--neff-cache``; on neuron one
            folder per compiler version below it, and a default where none is given; inductor's FX
            graph cache elsewhere), None to leave the environment's choice.
        host_memory_gib: address-space cap of every run.py process (``--host-memory-gib``), None for none.
        cpu_check_memory_gib: host memory the teacher-forced CPU check of a sharded run may take
            (``--cpu-check-memory-gib``), None for what the host has available when it starts.
        self_check: the host's doctor self-check for this device (``results_dir/doctor.json``), as
            every row records it; None when none was run.
        hub_unreachable: why the session found the Hub unreachable before planning (``hub.unreachable``,
            e.g. ``http://host:port is unreachable (Connection refused)``), None when it answered or was
            not asked (``HF_HUB_OFFLINE=1`` set by the user is not this: the runs inherit it anyway).
            When set, every process the session starts for a model runs with ``HF_HUB_OFFLINE=1``
            (``run.context.session_env``) and a load failure says why in one line.
        cpu_threads: OMP_NUM_THREADS of every process the session runs for a model (``--cpu-threads``,
            ``session.resolve.resolve_cpu_threads``), None to leave the environment's as it is.
    """

    # The settings that change a result are declared so (CHANGES_RESULT: their place in the settings hash);
    # the prompt changes one too, through each model's own prompt (checks.rows.settings_hash).
    device: DeviceKind = field(metadata={CHANGES_RESULT: 1})
    neuron_cores: int
    max_new_tokens: int = field(metadata={CHANGES_RESULT: 0})
    prompt: str
    model_timeout: float
    results_dir: Path
    compile_backend: str = field(metadata={CHANGES_RESULT: 2})
    reference_dtype: str | None = field(metadata={CHANGES_RESULT: 3})
    allow_remote_code: bool
    stack: Stack
    core_bytes: int = field(metadata={CHANGES_RESULT: 7}, default=24 << 30)
    memory_headroom: float = field(metadata={CHANGES_RESULT: 8}, default=DEFAULT_HEADROOM)
    max_cores: int = field(metadata={CHANGES_RESULT: 9}, default=DEFAULT_MAX_CORES)
    core_ledger: Path | None = None
    judge_model: str = field(metadata={CHANGES_RESULT: 5}, default=DEFAULT_JUDGE)
    judge_revision: str = field(metadata={CHANGES_RESULT: 6}, default="main")
    parity: str = field(metadata={CHANGES_RESULT: 4}, default="exact")
    reference_cache: Path | None = None
    neff_cache: Path | None = None
    host_memory_gib: float | None = None
    cpu_check_memory_gib: float | None = None
    cores: tuple[int, ...] = ()
    session: str = ""
    self_check: str | None = None
    hub_unreachable: str | None = None
    cpu_threads: int | None = None

    @property
    def host_memory_limit(self) -> int | None:
        """``--host-memory-gib`` in bytes: every run.py's address-space cap."""
        return None if self.host_memory_gib is None else int(self.host_memory_gib * GIB)

    @property
    def cpu_check_memory(self) -> int | None:
        """``--cpu-check-memory-gib`` in bytes."""
        return None if self.cpu_check_memory_gib is None else int(self.cpu_check_memory_gib * GIB)


def core_pool(settings: Settings) -> CorePool:
    """The session's view of the host-wide core ledger: its slice, its cap, the device's owners."""
    assert settings.core_ledger is not None
    command = settings.device.owners_command
    return CorePool(
        settings.core_ledger,
        settings.cores or settings.neuron_cores,
        limit=settings.neuron_cores,
        session=settings.session or None,
        device=settings.device.name,
        owners=None if command is None else neuron_owners(command),
    )


def run_dir(results_dir: Path, device: str, model_id: str) -> Path:
    """A catalog model's run folder on ``device``: its run.py, result and log, per run kind
    (``device``, ``reference``, ``cpu-check``, ``judge``; the training check's under ``train``)."""
    return results_dir / "runs" / slug(model_id) / device


def timeout_of(model: ModelSpec, settings: Settings) -> float:
    """Seconds each of ``model``'s run.py processes may take: the entry's ``timeout``, else
    ``--model-timeout``."""
    return settings.model_timeout if model.timeout is None else model.timeout


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
