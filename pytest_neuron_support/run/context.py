"""One model's check as the runs see it (:class:`Job`), the environments its processes get, and how a
rendered script of it is executed.

Every process a check starts for a model runs through :func:`execute`: rendered from its spec into its
own folder, isolated in a process group of its own, under the model's timeout and the session's host
memory cap. The device run gets the lease's pinning (:func:`device_run_env`); everything on the CPU
side (reference, teacher-forced check, judge, training's CPU steps) gets :func:`cpu_env`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

from pytest_neuron_support.base.model import ModelSpec
from pytest_neuron_support.devices.table import DEVICES, NO_DEVICE_ENV
from pytest_neuron_support.planning.planner import Plan
from pytest_neuron_support.run import neffcache
from pytest_neuron_support.run.execution import ProcessOutcome
from pytest_neuron_support.run.runscript import RunSpec, TrainSpec, render_and_run
from pytest_neuron_support.run.settings import Settings, timeout_of

#: The device run's folder in a check's workdir.
DEVICE_RUN = "device"


@dataclass(frozen=True)
class Job:
    """One check of one model: what every run of it needs.

    Attributes:
        model: the model checked.
        settings: the session's settings.
        plan: its plan (cores, sharding).
        workdir: its run folder (``device/``, ``reference/``, ``cpu-check/``, ``judge/``, ``cpu/``).
        environ: the environment its processes start from (the caller's, tokens included: every file
            a run leaves is scrubbed of them).
        relet: leases the check's cores again, as ``with job.relet() as (first, count):`` (the device run's
            lease is released when it ends; a numerics FAIL's module search runs on the device once more);
            None where the caller holds no core ledger.
    """

    model: ModelSpec
    settings: Settings
    plan: Plan
    workdir: Path
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    relet: Callable[[], AbstractContextManager[tuple[int, int]]] | None = None

    @property
    def sharded(self) -> bool:
        return self.plan.cores > 1

    def cpu_env(self) -> dict[str, str]:
        return cpu_env(self.settings, self.environ)

    def in_results(self, path: Path) -> str:
        """A run's file as a row names it: relative to the results folder (absolute outside it)."""
        try:
            return path.relative_to(self.settings.results_dir).as_posix()
        except ValueError:
            return str(path)

    def rerun_on_device(self, spec: RunSpec, folder: str) -> ProcessOutcome | None:
        """Run ``spec`` on the device once more, in ``workdir/folder``, under a lease of the check's cores taken
        again (:attr:`relet`) and held only while it runs; None where there is no lease to take."""
        if self.relet is None:
            return None
        with self.relet() as (first, count):
            return self.execute_on_device(spec, folder, self.settings.device.pin_cores(first, count))[1]

    def execute(
        self,
        spec: RunSpec | TrainSpec,
        folder: str,
        env: Mapping[str, str],
        cancel: threading.Event | None = None,
        *,
        warm: bool = False,
    ) -> tuple[str, ProcessOutcome]:
        """Render ``spec`` into ``workdir/folder`` and run it isolated there: (its source, how it ended).
        ``warm``: it may start from a warm interpreter (``execution.run_script``)."""
        return render_and_run(
            spec,
            self.workdir / folder,
            env=env,
            timeout=timeout_of(self.model, self.settings),
            memory_limit=self.settings.host_memory_limit,
            cancel=cancel,
            warm=warm,
        )

    def execute_on_device(
        self, spec: RunSpec | TrainSpec, folder: str, pinned: Mapping[str, str], cancel: threading.Event | None = None
    ) -> tuple[str, ProcessOutcome]:
        """:meth:`execute` on the device, pinned to the lease's cores (:func:`device_run_env`). A run of one rank
        starts from the session's warm interpreter where the device table allows it (``warm_runs``: cpu): its
        environment then holds the table's variables already, so the server that imported inductor for it
        read the settings the run compiles with."""
        env = device_run_env(self.settings, self.environ, pinned, spec.world_size)
        warm = self.settings.device.warm_runs and spec.world_size == 1
        return self.execute(spec, folder, env, cancel, warm=warm)

    def execute_on_cpu(
        self, spec: RunSpec | TrainSpec, folder: str, cancel: threading.Event | None = None
    ) -> tuple[str, ProcessOutcome]:
        """:meth:`execute` on the CPU side (:func:`cpu_env`). A script that compiles nothing (a reference,
        a check, training's CPU side: each is built eager) starts from the session's warm interpreter where there
        is one (``run.forkserver``); one that compiled would always be a fresh process."""
        return self.execute(spec, folder, self.cpu_env(), cancel, warm=not spec.compile)


def session_env(settings: Settings, environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` for a process the session starts for a model:

    - offline (``HF_HUB_OFFLINE=1``) when the session found the Hub unreachable
      (``settings.hub_unreachable``): ``from_pretrained`` then loads from the cache or fails at once,
      instead of through the client's connection retries (about 50 s a load); otherwise the user's own
      ``HF_HUB_OFFLINE`` as it is;
    - ``OMP_NUM_THREADS`` set to the session's ``settings.cpu_threads`` (``--cpu-threads``): the workers'
      concurrent runs share the CPUs instead of each sizing its thread pool to the whole machine
      (``run.threads.cpu_threads`` says what that oversubscription costs). None leaves the user's own."""
    env = dict(environ)
    if settings.hub_unreachable is not None:
        env["HF_HUB_OFFLINE"] = "1"
    if settings.cpu_threads is not None:
        env["OMP_NUM_THREADS"] = str(settings.cpu_threads)
    return env


def device_run_env(
    settings: Settings, environ: Mapping[str, str], pinned: Mapping[str, str], ranks: int = 1
) -> dict[str, str]:
    """The environment of a device run of ``ranks`` ranks: the device table's variables for it
    (``DeviceKind.env_for``; the caller's own value of one wins, as run.py's ``setdefault`` of them does), the
    caller's (offline when the session found the Hub unreachable, with the session's CPU threads:
    :func:`session_env`), the lease's pinning (the device's core variable) and, with ``--neff-cache``, the
    device's compile cache variable."""
    return {**_device_variables(settings, ranks), **session_env(settings, environ), **pinned}


def _device_variables(settings: Settings, ranks: int) -> dict[str, str]:
    """What a device run of ``ranks`` ranks holds beside the caller's environment: the device table's variables
    for it and, with ``--neff-cache``, the device's compile cache variable."""
    env = settings.device.env_for(ranks)
    if settings.neff_cache is not None:
        # neuron: one folder per compiler version (its cache keys hold none), the one neff pull and push use
        cache = neffcache.run_cache_dir(settings.device, settings.neff_cache, settings.stack.neuronx_cc)
        env[settings.device.compile_cache_env] = str(cache)
    return env


_PIN_VARS = frozenset(kind.core_env_var for kind in DEVICES.values() if kind.core_env_var)


def cpu_env(settings: Settings, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of a CPU-side run (reference, CPU check, judge, training's CPU side): offline
    when the session found the Hub unreachable, with the session's CPU threads (:func:`session_env`),
    no device core pinning, and no device backend autoloaded (importing torch would load torch-neuronx
    on a trn2 host).

    On a device whose one-rank runs start warm (``DeviceKind.warm_runs``: cpu) it also holds what such a run's
    environment holds beside the caller's (:func:`_device_variables`; the caller's own value still wins), so
    that the two environments are one and one warm interpreter a process serves both sides' runs
    (``run.forkserver``: a server serves only runs of its own environment, and each costs an import of torch
    and transformers, about 4.5 CPU-s). Those variables are inductor's settings, read only by a compile (no
    CPU-side script compiles: references, checks and training's CPU side are built eager; run.py sets the
    same ones itself from its SPEC's cpu row), and the cpu row's ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``, which
    is :data:`NO_DEVICE_ENV` itself."""
    env = session_env(settings, environ)
    shared = _device_variables(settings, 1) if settings.device.warm_runs else {}
    return {**shared, **{k: v for k, v in env.items() if k not in _PIN_VARS}, **NO_DEVICE_ENV}
