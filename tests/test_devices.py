"""The device table: facts that only differ by row, and what follows from them on CPU."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from pytest_neuron_support.data.records import current_stack
from pytest_neuron_support.devices.table import (
    DEVICES,
    NO_DEVICE_ENV,
    ProbeResult,
    compiler_version,
    fallback_core_bytes,
    probe,
)
from pytest_neuron_support.run.context import cpu_env
from pytest_neuron_support.run.settings import Settings

GIB = 1 << 30


def test_core_memory_without_a_device_figure_follows_the_logical_core_config() -> None:
    neuron = DEVICES["neuron"]
    assert fallback_core_bytes(neuron, {}) == 24 * GIB  # trn2 default LNC=2: one 24 GiB bank per logical core
    assert fallback_core_bytes(neuron, {"NEURON_LOGICAL_NC_CONFIG": "1"}) == 12 * GIB
    assert fallback_core_bytes(neuron, {"NEURON_LOGICAL_NC_CONFIG": "junk"}) == 24 * GIB
    assert fallback_core_bytes(DEVICES["cpu"], {"NEURON_LOGICAL_NC_CONFIG": "1"}) == 24 * GIB  # plans as a trn2 core


def settings_on(device: str, **changes: Any) -> Settings:
    """A session's settings on ``device`` with what these tests vary given as ``changes``."""
    fields: dict[str, Any] = {
        "device": DEVICES[device],
        "neuron_cores": 1,
        "max_new_tokens": 4,
        "prompt": "p",
        "model_timeout": 60.0,
        "results_dir": Path("out"),
        "compile_backend": "inductor",
        "reference_dtype": None,
        "allow_remote_code": False,
        "stack": current_stack(),
    }
    return Settings(**{**fields, **changes})


def test_cpu_side_runs_are_unpinned_and_load_no_device_backend() -> None:
    environ = {"NEURON_RT_VISIBLE_CORES": "8-9", "CUDA_VISIBLE_DEVICES": "1", "HOME": "/h"}
    for device in DEVICES:
        env = cpu_env(settings_on(device), environ)
        assert env["HOME"] == "/h" and env["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "0", device
        assert "NEURON_RT_VISIBLE_CORES" not in env and "CUDA_VISIBLE_DEVICES" not in env, device
    # Where device runs are fresh processes, nothing of the device's table reaches the CPU side.
    assert cpu_env(settings_on("neuron"), environ) == {"HOME": "/h", **NO_DEVICE_ENV}


def test_on_the_cpu_device_a_one_rank_run_and_the_cpu_side_have_one_environment() -> None:
    """So that one warm interpreter a process serves both (a server serves only runs of its own environment, and
    each imports torch and transformers): the cpu row keeps device backends out as the CPU side does, and the CPU
    side holds the compiler's settings a device run holds (a user's own value of one still wins, on both sides)."""
    from pytest_neuron_support.run.context import device_run_env

    for changes in ({}, {"neff_cache": Path("/base")}):
        cpu = settings_on("cpu", **changes)
        for environ in ({"HOME": "/h"}, {"HOME": "/h", "TORCHINDUCTOR_CPP_WRAPPER": "0"}):
            assert cpu_env(cpu, environ) == device_run_env(cpu, environ, {}, 1), (changes, environ)
    assert DEVICES["cpu"].env["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "0"
    # A sharded run's ranks (fresh processes) keep the table's rule for them: no C++ wrapper.
    assert cpu_env(settings_on("cpu"), {})["TORCHINDUCTOR_CPP_WRAPPER"] == "1"
    assert "TORCHINDUCTOR_CPP_WRAPPER" not in device_run_env(settings_on("cpu"), {}, {}, 2)


def test_the_compiler_version_is_probed_only_where_a_device_has_a_compiler() -> None:
    assert DEVICES["cpu"].compiler_version_expr is None and compiler_version(DEVICES["cpu"]) == "none"
    # No neuronx-cc here: the probe subprocess fails to import it and says so with "none".
    assert compiler_version(DEVICES["neuron"]) == "none"


def test_find_device_counts_a_host_counted_kind_without_probing() -> None:
    import os

    from pytest_neuron_support.devices.table import find_device

    def no_probe() -> ProbeResult:
        raise AssertionError("cpu needs no probe subprocess")

    found = find_device("cpu", no_probe)
    assert found.kind is DEVICES["cpu"] and found.available == (os.cpu_count() or 1) and found.core_memory is None


def test_find_device_auto_takes_the_first_kind_with_cores_and_its_memory() -> None:
    from pytest_neuron_support.devices.table import find_device

    seen = ProbeResult({"neuron": 64, "cuda": 0, "cpu": 2}, {"neuron": 24 << 30})
    found = find_device("auto", lambda: seen)
    assert (found.kind.name, found.available, found.core_memory) == ("neuron", 64, 24 << 30)
    nothing = ProbeResult({"neuron": 0, "cuda": 0, "cpu": 2})
    assert find_device("auto", lambda: nothing).kind.name == "cpu"


def test_find_device_names_a_missing_kind_and_the_fix() -> None:
    from pytest_neuron_support.devices.table import DeviceNotFound, find_device

    with pytest.raises(DeviceNotFound, match=r"--device=cuda: no cuda device is visible.*--device=cpu"):
        find_device("cuda", lambda: ProbeResult({"neuron": 0, "cuda": 0, "cpu": 2}))


#: A stand-in for torch with torch-neuronx loaded, as the probe subprocess imports it: it records every
#: call with the NEURON_RT_VISIBLE_CORES it ran under, and, like the real runtime (``_lazy_init`` ->
#: ``nrt_init``), takes "every core it sees" when a property is read with nothing pinned.
FAKE_TORCH = """
import json, os

_LOG = os.environ["FAKE_TORCH_LOG"]


def _record(call):
    with open(_LOG, "a") as log:
        log.write(json.dumps({"call": call, "pinned": os.environ.get("NEURON_RT_VISIBLE_CORES")}) + "\\n")


class _Properties:
    total_memory = 24 << 30


class _Neuron:
    @staticmethod
    def is_available():
        _record("is_available")
        return True

    @staticmethod
    def device_count():
        _record("device_count")
        return 1 if os.environ.get("NEURON_RT_VISIBLE_CORES") else 64

    @staticmethod
    def get_device_properties(index):
        _record("get_device_properties")
        return _Properties()


neuron = _Neuron()


class _Cuda:
    @staticmethod
    def is_available():
        return False

    @staticmethod
    def device_count():
        return 0


cuda = _Cuda()
"""


def fake_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    package = tmp_path / "fake" / "torch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(textwrap.dedent(FAKE_TORCH))
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "fake"))
    monkeypatch.setenv("FAKE_TORCH_LOG", str(log))
    monkeypatch.delenv("NEURON_RT_VISIBLE_CORES", raising=False)
    return log


def calls(log: Path) -> list[dict[str, str | None]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_the_session_probe_counts_neuron_cores_without_initialising_the_runtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The issue: the probe evaluated get_device_properties(0) unpinned, i.e. nrt_init over every core of
    # the host at every session's start; device_count() needs no init.
    log = fake_torch(tmp_path, monkeypatch)
    seen = probe(("neuron", "cuda"))
    assert seen.counts == {"neuron": 64, "cuda": 0}
    assert "neuron" not in seen.core_memory  # the planner takes the LNC figure (fallback_core_bytes)
    unpinned = [c["call"] for c in calls(log) if c["pinned"] is None]
    assert "device_count" in unpinned and "get_device_properties" not in unpinned, calls(log)


def test_only_kinds_whose_memory_read_initialises_a_runtime_need_pinning() -> None:
    assert DEVICES["neuron"].memory_needs_pinning and DEVICES["neuron"].core_env_var
    assert not DEVICES["cuda"].memory_needs_pinning and not DEVICES["cpu"].memory_needs_pinning


def test_a_neuron_run_gets_its_compilers_own_cache_folder_and_a_cpu_run_the_base() -> None:
    # torch-neuronx's cache keys hold no compiler version: the run, neff pull and neff push must all use
    # <base>/neuronxcc-<version> (neffcache.run_cache_dir), or a new compiler is served the old one's NEFFs.
    from dataclasses import replace

    from pytest_neuron_support.run.context import device_run_env

    def settings(device: str, compiler: str) -> Settings:
        return settings_on(device, stack=replace(current_stack(), neuronx_cc=compiler), neff_cache=Path("/base"))

    neuron = device_run_env(settings("neuron", "2.16.0.0+1a2b3c4d"), {}, {"NEURON_RT_VISIBLE_CORES": "4"})
    assert neuron["TORCH_NEURONX_NEFF_CACHE_DIR"] == "/base/neuronxcc-2.16.0.0+1a2b3c4d"
    assert device_run_env(settings("cpu", "none"), {}, {})["TORCHINDUCTOR_CACHE_DIR"] == "/base"


def test_a_device_run_starts_with_the_tables_variables_under_the_callers_own() -> None:
    """A warm device run's server imported inductor with the run's environment: the table's variables must be in it
    from the start (run.py's own setdefault of them comes after that import), and a user's value still wins."""
    from pytest_neuron_support.run.context import device_run_env

    cpu = settings_on("cpu")
    one = device_run_env(cpu, {"HOME": "/h"}, {}, 1)
    assert one["TORCHINDUCTOR_CPP_WRAPPER"] == "1" and one["TORCHINDUCTOR_VEC_ISA_OK"] == "1"
    sharded = device_run_env(cpu, {"HOME": "/h"}, {}, 4)
    assert "TORCHINDUCTOR_CPP_WRAPPER" not in sharded and sharded["TORCHINDUCTOR_VEC_ISA_OK"] == "1"
    assert device_run_env(cpu, {"TORCHINDUCTOR_CPP_WRAPPER": "0"}, {}, 1)["TORCHINDUCTOR_CPP_WRAPPER"] == "0"
    neuron = device_run_env(settings_on("neuron"), {}, {"NEURON_RT_VISIBLE_CORES": "4"}, 1)
    assert neuron["TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION"] == "1"


def test_only_the_cpu_row_starts_device_runs_warm() -> None:
    # neuron: import torch loads torch-neuronx, whose runtime a fork cannot share; cuda: not proven on a GPU.
    assert {name for name, kind in DEVICES.items() if kind.warm_runs} == {"cpu"}
