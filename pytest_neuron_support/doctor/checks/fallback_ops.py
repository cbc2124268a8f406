"""Check `fallback-ops`: the device table's ``fallback_ops_expr`` (the ops the eager prefill ran on the
host) evaluates, on a core this check holds."""

from __future__ import annotations

from pytest_neuron_support.devices.table import DeviceKind
from pytest_neuron_support.doctor.check import ON_DEVICE, Check, Doctor


def expected(kind: DeviceKind) -> str:
    return f"`{kind.fallback_ops_expr or '<fallback_ops_expr>'}` evaluates (ops the eager prefill ran on the host)"


def not_applicable(kind: DeviceKind) -> str | None:
    if kind.fallback_ops_expr is not None:
        return None
    return f"nothing falls back to the host on {kind.name} (fallback_ops_expr is None)"


def run(doctor: Doctor) -> tuple[str, bool]:
    cores = doctor.free_cores(1)
    if cores is None:
        return "no free core in this session's slice", False
    expr = doctor.kind.fallback_ops_expr
    outcome = doctor.run("fallback-ops", "evaluate", {"expr": expr}, doctor.device_env(cores))
    if outcome.error is not None:
        return f"`{expr}`: {outcome.error}", False
    return f"`{expr}` = {outcome.get('value')}", True


CHECK = Check(
    key="fallback-ops",
    name="fallback ops readable",
    expected=expected,
    run=run,
    not_applicable=not_applicable,
    needs=ON_DEVICE,
    scripts=("evaluate",),
)
