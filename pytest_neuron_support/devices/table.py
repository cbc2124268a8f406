"""The device seam: one table of everything that differs between neuron, cuda and cpu.

Everything device-specific the harness or a rendered ``run.py`` needs is a field of
:class:`DeviceKind`; code elsewhere looks the kind up and reads fields, it never branches
on the device name (the transformers ``testing_utils`` backend-table style).

The neuron row follows ``shared/reference/torchneuron.md`` (Neuron SDK 2.33). No machine
that builds this project has Trainium, so the neuron row is exercised only on a trn2 host;
the cpu and cuda rows run the very same code paths in CI.

This module must stay import-light: it is imported by ``pytest --help``. Probing what the
machine has is done in a short-lived subprocess (:func:`probe`), so the pytest controller
never initialises a device (on neuron that would reserve every core until it exits).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class DeviceKind:
    """How one accelerator family is driven.

    Attributes:
        name: ``neuron``, ``cuda`` or ``cpu``; the value of ``--device``.
        device_map: passed as ``from_pretrained(device_map=...)``. Neuron must be explicit:
            Accelerate lists no neuron devices, so ``"auto"`` silently loads on CPU.
        compile_backend: ``torch.compile`` backend generate() uses for decoding.
        dist_backend: ``torch.distributed`` backend for sharded runs.
        core_env_var: environment variable that pins a process to leased cores, or None
            where processes need no pinning (cpu).
        core_env_contiguous: the variable takes a contiguous range ``i-j`` (neuron) rather
            than a comma list (cuda).
        force_compile: generate() only auto-compiles on accelerator device types; on cpu
            transformers' ``CompileConfig._compile_all_devices`` must force it, so the
            compile path every neuron run takes is exercised here too.
        memory_module: attribute of ``torch`` holding the allocator statistics
            (``torch.neuron`` / ``torch.cuda``), or None where there is no device memory.
        env: variables run.py sets before importing torch. On neuron,
            ``TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=1`` stops torch-neuronx from rerunning a
            compiled graph eagerly after it failed to *execute* (``backend.py``), which would be a
            false PASS; a graph that fails to *compile* raises with or without it (neuronx-cc runs
            asynchronously, so its errors surface at execution or ``synchronize()``).
        unsharded_env: variables run.py sets, beside ``env``, for a run of one rank only (cpu: inductor's
            C++ wrapper, which compiles a graph as one translation unit but cannot call a sharded graph's
            ops).
        count_expr: Python expression (after ``import torch``) giving how many cores or
            devices the machine has; evaluated only inside :func:`probe`'s subprocess. It must
            not initialise the runtime (neuron: ``device_count()`` reads
            ``nrt_get_visible_vnc_count``, no ``nrt_init``).
        memory_expr: expression giving one core's memory in bytes (same rules), or None
            where a core has no memory of its own (cpu plans as if on a trn2 core).
        memory_needs_pinning: evaluating ``memory_expr`` initialises the device runtime over every
            core the process can see (neuron: ``get_device_properties`` -> ``_lazy_init`` ->
            ``nrt_init``, which reserves them until the process exits). :func:`probe` then never
            evaluates it; only ``neuron-support doctor``'s ``memory`` check does, in a process pinned to one
            core it holds. False where reading it reserves nothing (cuda).
        compile_cache_env: variable naming the compile cache directory (``--neff-cache``).
        compile_cache_per_compiler: the compile cache's keys hold no compiler version (neuron:
            ``KernelExecution.cpp`` keys on the stablehlo hash, target, LNC, opt level and args), so a
            run gets one directory per compiler version under ``--neff-cache``
            (``neffcache.run_cache_dir``); False where the keys already change with the compiler
            (inductor's hold the torch version and its code).
        cache_stats_expr: expression run.py evaluates (after ``import torch``) for the persistent
            compile cache's counters, a mapping with ``persistent_hits`` / ``persistent_misses``
            (torch-neuronx's ``_C._get_compilation_cache_stats()``, counted only with
            ``TORCH_NEURONX_METRICS_ENABLED=1``); None where run.py reads inductor's FX-graph cache
            counters instead.
        fallback_ops_expr: expression run.py evaluates for the operations that ran on the host
            instead of the device (the eager prefill can fall back silently: the fallback switch
            covers compiled graphs only), or None where nothing falls back.
        visible_env_vars: variables through which a parent hands a session its slice of the host's
            cores (host numbering): the pool is that slice, and children are pinned inside it.
        owners_command: command that lists the device's cores owned by processes (JSON), so the ledger
            does not lease a core a process outside it holds (``cores.core_owners``); None where
            no such listing exists.
        physical_core_bytes: memory of the bank behind one physical core, for devices that report no
            per-core memory; a logical core of ``NEURON_LOGICAL_NC_CONFIG`` (LNC) physical cores gets
            LNC times this. None where cores are planned as trn2 logical cores (cpu).
        max_pool: largest ``--neuron-cores`` accepted, or None for "what the probe counts";
            cpu cores are slots for ranks, not physical CPUs, so any pool up to 64 works.
        compiler_version_expr: expression (no torch needed) giving the device compiler's version as
            its cache keys and published NEFF caches spell it (``neuronxcc.__version__`` keeps the
            local label, ``+56dc5a86``, that the distribution's metadata may lack), or None where the
            device has no compiler of its own; evaluated only in :func:`compiler_version`'s subprocess.
        host_counted: the kind's cores are counted on the host itself (cpu: ``os.cpu_count()``), so
            choosing it needs no probe subprocess (no torch import in the pytest process's children).
        runtime_module: the Python package that registers the device with torch (``torch_neuronx``:
            torch autoloads it through the ``torch.backends`` entry point, and the table's expressions
            import it), or None where torch itself drives the device (cuda, cpu). ``neuron-support
            doctor`` checks that it imports, is autoloaded by ``import torch``, and stays out of a
            process started with :data:`NO_DEVICE_ENV`.
        root_comm_env: variable naming the device runtime's own root-communication address of a
            sharded run (neuron: ``NEURON_RT_ROOT_COMM_ID``, ``host:port``), or None where the runtime
            has none (cpu, cuda: the process group's store is all). Unset, torch-neuronx's backend has
            rank 0 pick a port free now that the runtime binds later (``get_free_port``), so two
            concurrent sharded runs can take the same one; run.py sets it from the lease instead
            (templates/common.py ``root_comm_port``), rank 0 checks and publishes it.
        warm_runs: a device run of one rank may start as a fork of the session's warm interpreter
            (``run.forkserver``, as the CPU side's scripts do), torch and transformers already imported:
            importing them starts nothing of the device (cpu). False where the device's runtime comes
            with ``import torch`` and cannot be shared through a fork (neuron: torch autoloads
            torch-neuronx), or where that is not proven (cuda: a CUDA context does not survive a fork, and
            no GPU machine has shown that the server's imports create none). A sharded run's ranks are
            fresh processes everywhere (templates/common.py ``spawn_ranks``).
        train_use_cpu: train.py passes ``TrainingArguments(use_cpu=...)``: True on cpu, where Accelerate
            would otherwise refuse ``bf16=True`` without a bf16 GPU (and would pick a GPU if one is
            present); False where the Trainer finds the device itself (neuron: transformers' own
            ``is_torch_neuron_available``, cuda).
    """

    name: str
    device_map: str
    compile_backend: str
    dist_backend: str
    core_env_var: str | None
    core_env_contiguous: bool
    force_compile: bool
    memory_module: str | None
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    unsharded_env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    count_expr: str = "0"
    memory_expr: str | None = None
    memory_needs_pinning: bool = False
    compile_cache_env: str = "TORCHINDUCTOR_CACHE_DIR"
    compile_cache_per_compiler: bool = False
    cache_stats_expr: str | None = None
    fallback_ops_expr: str | None = None
    visible_env_vars: tuple[str, ...] = ()
    physical_core_bytes: int | None = None
    owners_command: tuple[str, ...] | None = None
    max_pool: int | None = None
    compiler_version_expr: str | None = None
    runtime_module: str | None = None
    root_comm_env: str | None = None
    host_counted: bool = False
    warm_runs: bool = False
    train_use_cpu: bool = False

    def pin_cores(self, first: int, count: int) -> dict[str, str]:
        """Environment that restricts a process to cores ``first .. first+count-1``."""
        if self.core_env_var is None or count <= 0:
            return {}
        if self.core_env_contiguous:
            value = str(first) if count == 1 else f"{first}-{first + count - 1}"
        else:
            value = ",".join(str(i) for i in range(first, first + count))
        return {self.core_env_var: value}

    def env_for(self, ranks: int) -> dict[str, str]:
        """The table's variables for a process of a run of ``ranks`` ranks: ``env``, and ``unsharded_env``
        for one rank (run.py applies the same rule to its SPEC, in templates/common.py ``main``)."""
        return {**self.env, **(self.unsharded_env if ranks <= 1 else {})}

    def as_runscript_spec(self) -> dict[str, Any]:
        """The subset run.py needs, embedded verbatim in the rendered script."""
        return {
            "name": self.name,
            "device_map": self.device_map,
            "compile_backend": self.compile_backend,
            "dist_backend": self.dist_backend,
            "core_env_var": self.core_env_var,
            "force_compile": self.force_compile,
            "memory_module": self.memory_module,
            "cache_stats_expr": self.cache_stats_expr,
            "fallback_ops_expr": self.fallback_ops_expr,
            "compiler_version_expr": self.compiler_version_expr,
            "env": dict(self.env),
            "unsharded_env": dict(self.unsharded_env),
            "train_use_cpu": self.train_use_cpu,
            "root_comm_env": self.root_comm_env,
        }


#: Environment of processes that must not touch any device: torch autoloads device backends
#: (torch-neuronx registers through the ``torch.backends`` entry point) unless this is 0.
NO_DEVICE_ENV: Mapping[str, str] = MappingProxyType({"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})


DEVICES: Mapping[str, DeviceKind] = MappingProxyType(
    {
        "neuron": DeviceKind(
            name="neuron",
            device_map="neuron",
            compile_backend="neuron",
            dist_backend="neuron",
            core_env_var="NEURON_RT_VISIBLE_CORES",
            core_env_contiguous=True,
            force_compile=False,
            memory_module="neuron",
            # Fallback disabled: a compiled graph that fails to execute is not rerun eagerly (a false
            # PASS; compile errors raise either way); metrics enabled: the persistent compile cache
            # counts anything only then.
            env=MappingProxyType(
                {"TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION": "1", "TORCH_NEURONX_METRICS_ENABLED": "1"}
            ),
            count_expr=(
                "torch.neuron.device_count() if hasattr(torch, 'neuron') and torch.neuron.is_available() else 0"
            ),
            memory_expr="torch.neuron.get_device_properties(0).total_memory",
            memory_needs_pinning=True,
            compile_cache_env="TORCH_NEURONX_NEFF_CACHE_DIR",
            compile_cache_per_compiler=True,
            compiler_version_expr="__import__('neuronxcc').__version__",
            cache_stats_expr="__import__('torch_neuronx')._C._get_compilation_cache_stats()",
            fallback_ops_expr="__import__('torch_neuronx').get_fallback_ops()",
            visible_env_vars=("NEURON_RT_VISIBLE_CORES",),
            # trn2: 96 GiB of HBM for 8 physical cores per chip.
            physical_core_bytes=12 << 30,
            owners_command=("neuron-ls", "-j"),
            runtime_module="torch_neuronx",
            root_comm_env="NEURON_RT_ROOT_COMM_ID",
        ),
        "cuda": DeviceKind(
            name="cuda",
            device_map="cuda",
            compile_backend="inductor",
            dist_backend="nccl",
            core_env_var="CUDA_VISIBLE_DEVICES",
            core_env_contiguous=False,
            force_compile=False,
            memory_module="cuda",
            count_expr="torch.cuda.device_count() if torch.cuda.is_available() else 0",
            visible_env_vars=("CUDA_VISIBLE_DEVICES",),
            memory_expr="torch.cuda.get_device_properties(0).total_memory",
        ),
        "cpu": DeviceKind(
            name="cpu",
            device_map="cpu",
            compile_backend="inductor",
            dist_backend="gloo",
            core_env_var=None,
            core_env_contiguous=False,
            force_compile=True,
            memory_module=None,
            # inductor's C++ wrapper: a graph's wrapper and kernels compile as one C++ translation unit
            # instead of one per kernel (each including torch's kernel prefix header), so a cold compile of a
            # one-rank tiny-zoo run costs about a fifth less CPU (yolos 17 CPU-s against 22, qwen3 28 against
            # 33, the whole run.py: benchmarks/results/ci-timings.md); the kernels are the same code. Not
            # for sharded runs: the C++ wrapper cannot call the ops of a tensor-parallel graph ("arg type Any
            # is not yet supported by custom_op_wrapper", torch 2.13). A user's own value wins.
            unsharded_env=MappingProxyType({"TORCHINDUCTOR_CPP_WRAPPER": "1"}),
            # inductor takes the vector ISAs /proc/cpuinfo lists (those the kernel enabled) instead of
            # proving each in every process that compiles: its probe builds a test program per ISA (cached)
            # and then starts a Python child per ISA to dlopen it (not cached), about 1.2 CPU-s a process.
            # A compiler that cannot build one fails the compile with its own error (a user's own
            # TORCHINDUCTOR_VEC_ISA_OK=0 compiles scalar kernels instead).
            # And no device backend loads into a cpu run: on a trn2 host torch-neuronx would otherwise load
            # with torch, into the run and into the warm interpreter it forks from (run.forkserver). The
            # CPU side sets the same (NO_DEVICE_ENV), so the two sides' environments can be one
            # (run.context.cpu_env).
            env=MappingProxyType({"TORCHINDUCTOR_VEC_ISA_OK": "1", **NO_DEVICE_ENV}),
            # A cpu "core" in the pool is a slot for one rank, not a physical CPU.
            count_expr="__import__('os').cpu_count() or 1",
            max_pool=64,
            host_counted=True,
            # A one-rank cpu run forks the session's warm interpreter: about 5 CPU-s of imports saved a run
            # (benchmarks/warm_starts.py).
            warm_runs=True,
            train_use_cpu=True,
        ),
    }
)

#: ``--device auto`` takes the first of these that reports at least one core.
AUTO_ORDER: tuple[str, ...] = ("neuron", "cuda", "cpu")


@dataclass(frozen=True)
class ProbeResult:
    """What a throwaway subprocess saw: cores per device kind (0 = absent), and the
    memory of one core where the kind reports it."""

    counts: Mapping[str, int]
    core_memory: Mapping[str, int] = field(default_factory=dict)

    def resolve(self, choice: str) -> str:
        """Map ``--device`` (``auto`` or a kind) to a concrete kind name."""
        if choice != "auto":
            return choice
        for name in AUTO_ORDER:
            if self.counts.get(name, 0) > 0:
                return name
        return "cpu"


_PROBE_SCRIPT = """
import json, sys
import torch
exprs = json.loads(sys.argv[1])
out = {"counts": {}, "core_memory": {}}
for name, (count, memory) in exprs.items():
    try:
        out["counts"][name] = int(eval(count))
    except Exception:
        out["counts"][name] = 0
    if memory and out["counts"][name] > 0:
        try:
            out["core_memory"][name] = int(eval(memory))
        except Exception:
            pass
print(json.dumps(out))
"""


def probe_expressions(names: tuple[str, ...] = AUTO_ORDER) -> dict[str, tuple[str, str | None]]:
    """What :func:`probe`'s unpinned subprocess evaluates per kind: the count, and the memory only where
    reading it initialises no runtime (``memory_needs_pinning`` False). The session probe runs before
    the session holds any core, so a neuron memory read there would reserve every core of the host."""
    return {
        name: (DEVICES[name].count_expr, None if DEVICES[name].memory_needs_pinning else DEVICES[name].memory_expr)
        for name in names
    }


def _probe_run(exprs: Mapping[str, tuple[str, str | None]], python: str, timeout: float, env: Mapping[str, str]) -> Any:
    proc = subprocess.run(
        [python, "-c", _PROBE_SCRIPT, json.dumps(exprs)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=dict(env),
    )
    if proc.returncode != 0:
        raise RuntimeError(f"device probe failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def probe(names: tuple[str, ...] = AUTO_ORDER, python: str = sys.executable, timeout: float = 300) -> ProbeResult:
    """Count cores per device kind in a subprocess that exits straight away.

    Running this in the pytest process would initialise the runtime there: on neuron a
    process that pins nothing reserves every core until it exits. The subprocess pins nothing
    either, so it evaluates only what initialises no runtime (:func:`probe_expressions`); a kind
    whose memory read needs pinning reports no memory here (the doctor's ``memory`` check reads it pinned).
    """
    seen = _probe_run(probe_expressions(names), python, timeout, os.environ)
    return ProbeResult(
        counts={str(k): int(v) for k, v in seen["counts"].items()},
        core_memory={str(k): int(v) for k, v in seen["core_memory"].items()},
    )


#: A trn2 logical NeuronCore at the default LNC=2: the plan a device without per-core memory gets.
LNC_DEFAULT = 2
TRN2_LOGICAL_CORE_BYTES = 24 << 30


def fallback_core_bytes(kind: DeviceKind, environ: Mapping[str, str] | None = None) -> int:
    """Memory of one core for a device that reports none: LNC physical cores' worth on devices with a
    physical core size (``NEURON_LOGICAL_NC_CONFIG``, default 2), else a trn2 logical core at LNC=2
    (cpu plans as Trainium would)."""
    if kind.physical_core_bytes is None:
        return TRN2_LOGICAL_CORE_BYTES
    return kind.physical_core_bytes * logical_nc_config(environ)


def logical_nc_config(environ: Mapping[str, str] | None = None) -> int:
    """Physical cores per logical core (``NEURON_LOGICAL_NC_CONFIG``, default 2 on trn2; unreadable: 2)."""
    env = os.environ if environ is None else environ
    try:
        lnc = int(env.get("NEURON_LOGICAL_NC_CONFIG", LNC_DEFAULT))
    except ValueError:
        lnc = LNC_DEFAULT
    return max(lnc, 1)


def compiler_version(kind: DeviceKind, python: str = sys.executable, timeout: float = 120) -> str:
    """The device compiler's version (``none`` where the kind has none or it is not installed),
    read in a subprocess: importing the compiler package must not happen in the pytest controller."""
    if kind.compiler_version_expr is None:
        return "none"
    import os

    proc = subprocess.run(
        [python, "-c", f"print({kind.compiler_version_expr})"],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **NO_DEVICE_ENV},
    )
    lines = proc.stdout.strip().splitlines()
    return lines[-1].strip() if proc.returncode == 0 and lines else "none"


class DeviceNotFound(Exception):
    """``--device`` names a kind torch does not see on this host."""


@dataclass(frozen=True)
class FoundDevice:
    """The device kind a session runs on, how many cores it shows, and one core's memory where the
    kind reports it (None: the planner uses :func:`fallback_core_bytes`)."""

    kind: DeviceKind
    available: int
    core_memory: int | None = None


def find_device(choice: str, probe_devices: Callable[[], ProbeResult] | None = None) -> FoundDevice:
    """``--device`` (``auto`` or a kind) resolved to a kind and its core count: host-counted kinds
    (cpu) from the host, others through :func:`probe` (a throwaway subprocess). Raises
    :class:`DeviceNotFound` when the chosen kind shows no core."""
    if choice != "auto" and DEVICES[choice].host_counted:
        return FoundDevice(DEVICES[choice], os.cpu_count() or 1)
    seen = (probe_devices or probe)()
    kind = DEVICES[seen.resolve(choice)]
    available = (os.cpu_count() or 1) if kind.host_counted else seen.counts.get(kind.name, 0)
    if available < 1:
        raise DeviceNotFound(
            f"--device={choice}: no {kind.name} device is visible to torch; install its runtime or pass --device=cpu"
        )
    return FoundDevice(kind, available, seen.core_memory.get(kind.name))
