"""The device table: facts that only differ by row, and what follows from them on CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_neuron_support.devices import DEVICES, NO_DEVICE_ENV, ProbeResult, compiler_version, fallback_core_bytes
from pytest_neuron_support.pipeline import _cpu_env
from pytest_neuron_support.records import current_stack
from pytest_neuron_support.settings import Settings

GIB = 1 << 30


def test_core_memory_without_a_device_figure_follows_the_logical_core_config() -> None:
    neuron = DEVICES["neuron"]
    assert fallback_core_bytes(neuron, {}) == 24 * GIB  # trn2 default LNC=2: one 24 GiB bank per logical core
    assert fallback_core_bytes(neuron, {"NEURON_LOGICAL_NC_CONFIG": "1"}) == 12 * GIB
    assert fallback_core_bytes(neuron, {"NEURON_LOGICAL_NC_CONFIG": "junk"}) == 24 * GIB
    assert fallback_core_bytes(DEVICES["cpu"], {"NEURON_LOGICAL_NC_CONFIG": "1"}) == 24 * GIB  # plans as a trn2 core


def test_cpu_side_runs_are_unpinned_and_load_no_device_backend() -> None:
    settings = Settings(
        device=DEVICES["cpu"],
        pool_cores=1,
        max_new_tokens=4,
        prompt="p",
        model_timeout=60.0,
        results_dir=Path("out"),
        compile_backend="inductor",
        reference_dtype=None,
        allow_remote_code=False,
        stack=current_stack(),
    )
    env = _cpu_env(settings, {"NEURON_RT_VISIBLE_CORES": "8-9", "CUDA_VISIBLE_DEVICES": "1", "HOME": "/h"})
    assert env == {"HOME": "/h", **NO_DEVICE_ENV} and env["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "0"


def test_the_compiler_version_is_probed_only_where_a_device_has_a_compiler() -> None:
    assert DEVICES["cpu"].compiler_version_expr is None and compiler_version(DEVICES["cpu"]) == "none"
    # No neuronx-cc here: the probe subprocess fails to import it and says so with "none".
    assert compiler_version(DEVICES["neuron"]) == "none"


def test_find_device_counts_a_host_counted_kind_without_probing() -> None:
    import os

    from pytest_neuron_support.devices import find_device

    def no_probe() -> ProbeResult:
        raise AssertionError("cpu needs no probe subprocess")

    found = find_device("cpu", no_probe)
    assert found.kind is DEVICES["cpu"] and found.available == (os.cpu_count() or 1) and found.core_memory is None


def test_find_device_auto_takes_the_first_kind_with_cores_and_its_memory() -> None:
    from pytest_neuron_support.devices import find_device

    seen = ProbeResult({"neuron": 64, "cuda": 0, "cpu": 2}, {"neuron": 24 << 30})
    found = find_device("auto", lambda: seen)
    assert (found.kind.name, found.available, found.core_memory) == ("neuron", 64, 24 << 30)
    nothing = ProbeResult({"neuron": 0, "cuda": 0, "cpu": 2})
    assert find_device("auto", lambda: nothing).kind.name == "cpu"


def test_find_device_names_a_missing_kind_and_the_fix() -> None:
    from pytest_neuron_support.devices import DeviceNotFound, find_device

    with pytest.raises(DeviceNotFound, match=r"--device=cuda: no cuda device is visible.*--device=cpu"):
        find_device("cuda", lambda: ProbeResult({"neuron": 0, "cuda": 0, "cpu": 2}))
