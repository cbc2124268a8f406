"""Check `memory`: the device's memory statistics count a tensor after ``synchronize()``, on a core this
check holds; and the device's own per-core memory (``memory_expr``), read there, pinned, beside the
figure planning uses (shown, not judged)."""

from __future__ import annotations

from pytest_neuron_support.devices.table import DeviceKind, fallback_core_bytes
from pytest_neuron_support.doctor.check import ON_DEVICE, Check, Doctor, gib


def expected(kind: DeviceKind) -> str:
    return (
        f"torch.{kind.memory_module or '<memory_module>'}.max_memory_allocated() >= a 1 MiB tensor's size "
        "after synchronize()"
    )


def not_applicable(kind: DeviceKind) -> str | None:
    return None if kind.memory_module else f"{kind.name} has no device memory statistics (memory_module is None)"


def run(doctor: Doctor) -> tuple[str, bool]:
    cores = doctor.free_cores(1)
    if cores is None:
        return "no free core in this session's slice", False
    kind = doctor.kind
    outcome = doctor.run("memory", "memory", doctor.script_args(memory_expr=kind.memory_expr), doctor.device_env(cores))
    if outcome.error is not None:
        return f"{doctor.cores_text(cores)}: {outcome.error}", False
    peak, size = int(outcome.get("max_memory_allocated", 0)), int(outcome.get("tensor_bytes", 0))
    found = (
        f"{doctor.cores_text(cores)}: torch.{kind.memory_module}.max_memory_allocated() = {peak} B, "
        f"memory_allocated() = {outcome.get('memory_allocated')} B for a {size} B tensor on {outcome.get('device')}"
    )
    core_memory = outcome.get("core_memory")
    if core_memory is not None:
        # Shown, not judged (as the `device` check did before): which of the two is right is for a human to read.
        found += (
            f"; `{kind.memory_expr}` = {gib(int(core_memory))} per core pinned "
            f"(table fallback {gib(fallback_core_bytes(kind))})"
        )
    return found, peak >= size > 0


CHECK = Check(
    key="memory",
    name="memory API after synchronize()",
    expected=expected,
    run=run,
    not_applicable=not_applicable,
    needs=ON_DEVICE,
    scripts=("memory",),
)
