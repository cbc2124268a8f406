"""The device table: facts that only differ by row, and what follows from them on CPU."""

from __future__ import annotations

from pytest_neuron_support.devices import DEVICES, NO_DEVICE_ENV, compiler_version, fallback_core_bytes
from pytest_neuron_support.pipeline import _cpu_env

GIB = 1 << 30


def test_core_memory_without_a_device_figure_follows_the_logical_core_config() -> None:
    neuron = DEVICES["neuron"]
    assert fallback_core_bytes(neuron, {}) == 24 * GIB  # trn2 default LNC=2: one 24 GiB bank per logical core
    assert fallback_core_bytes(neuron, {"NEURON_LOGICAL_NC_CONFIG": "1"}) == 12 * GIB
    assert fallback_core_bytes(neuron, {"NEURON_LOGICAL_NC_CONFIG": "junk"}) == 24 * GIB
    assert fallback_core_bytes(DEVICES["cpu"], {"NEURON_LOGICAL_NC_CONFIG": "1"}) == 24 * GIB  # plans as a trn2 core


def test_cpu_side_runs_are_unpinned_and_load_no_device_backend() -> None:
    env = _cpu_env({"NEURON_RT_VISIBLE_CORES": "8-9", "CUDA_VISIBLE_DEVICES": "1", "HOME": "/h"})
    assert env == {"HOME": "/h", **NO_DEVICE_ENV} and env["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "0"


def test_the_compiler_version_is_probed_only_where_a_device_has_a_compiler() -> None:
    assert DEVICES["cpu"].compiler_version_expr is None and compiler_version(DEVICES["cpu"]) == "none"
    # No neuronx-cc here: the probe subprocess fails to import it and says so with "none".
    assert compiler_version(DEVICES["neuron"]) == "none"
