"""Check `compile`: ``torch.compile`` with the device's backend compiles a small function into at
least one graph whose result equals eager's."""

from __future__ import annotations

from pytest_neuron_support.devices.table import DeviceKind
from pytest_neuron_support.doctor.check import ON_DEVICE, Check, Doctor


def expected(kind: DeviceKind) -> str:
    return f"torch.compile(fn, backend={kind.compile_backend!r}) equals eager, unique_graphs >= 1"


def run(doctor: Doctor) -> tuple[str, bool]:
    cores = doctor.free_cores(1)
    if cores is None:
        return "no free core in this session's slice", False
    backend = doctor.kind.compile_backend
    outcome = doctor.run("compile", "compile", doctor.script_args(backend=backend), doctor.device_env(cores))
    if outcome.error is not None:
        return f"backend {backend}: {outcome.error}", False
    graphs, diff = int(outcome.get("graphs", 0)), float(outcome.get("max_rel_diff", float("inf")))
    found = f"{graphs} graph(s) compiled on {outcome.get('device')}; max relative difference to eager {diff:.1e}"
    return found, graphs >= 1 and diff <= 1e-4


CHECK = Check(
    key="compile",
    name="torch.compile with the device backend",
    expected=expected,
    run=run,
    needs=ON_DEVICE,
    scripts=("compile",),
)
