"""Check `bf16`: a bf16 matmul on the device equals the CPU's within bf16's tolerance. What it finds
decides the tiny generation's dtype (the `generation` check)."""

from __future__ import annotations

from pytest_neuron_support.devices.table import DeviceKind
from pytest_neuron_support.doctor.check import ON_DEVICE, Check, Doctor

#: Relative tolerance of a bf16 result (torch.testing's default rtol for bfloat16).
BF16_RTOL = 1.6e-2


def expected(kind: DeviceKind) -> str:
    return f"a 64x64 bf16 matmul on {kind.device_map} equals the CPU's within rtol {BF16_RTOL}"


def run(doctor: Doctor) -> tuple[str, bool]:
    cores = doctor.free_cores(1)
    if cores is None:
        return "no free core in this session's slice", False
    outcome = doctor.run("bf16", "bf16", doctor.script_args(), doctor.device_env(cores))
    if outcome.error is not None:
        return f"{doctor.cores_text(cores)}: {outcome.error}", False
    diff = float(outcome.get("max_rel_diff", float("inf")))
    doctor.bf16 = diff <= BF16_RTOL and outcome.get("dtype") == "torch.bfloat16"
    found = f"{outcome.get('dtype')} on {outcome.get('device')}: max relative difference {diff:.2e}"
    if "is_bf16_supported" in (outcome.result or {}):
        found += f"; is_bf16_supported() = {outcome.get('is_bf16_supported')}"
    return found, doctor.bf16


CHECK = Check(key="bf16", name="bf16 matmul", expected=expected, run=run, needs=ON_DEVICE, scripts=("bf16",))
