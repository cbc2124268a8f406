"""Check `device`: the device is there, with at least one core (``probe()``, as a session counts them),
and what per-core memory planning uses. On neuron it reads no core's properties: unpinned, that would
initialise the runtime over every core of the host; the `memory` check reads them pinned."""

from __future__ import annotations

from pytest_neuron_support.devices.table import DeviceKind, fallback_core_bytes, probe
from pytest_neuron_support.doctor.check import Check, Doctor, gib


def expected(kind: DeviceKind) -> str:
    return f"probe(): `{kind.count_expr}` >= 1"


def run(doctor: Doctor) -> tuple[str, bool]:
    kind = doctor.kind
    try:
        seen = doctor.probed if doctor.probed is not None and kind.name in doctor.probed.counts else None
        seen = seen or probe((kind.name,), python=doctor.python, timeout=doctor.timeout)
    except Exception as exc:
        return f"probe failed: {exc}", False
    doctor.count = seen.counts.get(kind.name, 0)
    if doctor.count < 1:
        # probe() reads a failing expression as 0: evaluate it once more to show why.
        why = doctor.run("count", "evaluate", {"expr": kind.count_expr}, doctor.device_env(()))
        detail = f"raises {why.error}" if why.error else f"evaluates to {why.get('value')} without an error"
        return f"no {kind.name} device visible to torch: `{kind.count_expr}` {detail}", False
    found = f"{doctor.count} reported"
    if kind.max_pool:
        found += f" (a session's pool may hold up to {kind.max_pool} slots: max_pool)"
    memory = seen.core_memory.get(kind.name)
    if kind.memory_expr is None:
        found += f"; no per-core memory ({kind.name} plans as {gib(fallback_core_bytes(kind))} per core)"
    elif kind.memory_needs_pinning:
        # Unpinned, the read would initialise the runtime over every core of the host (memory_needs_pinning).
        found += (
            f"; per-core memory not read here (memory_needs_pinning): the `memory` check reads "
            f"`{kind.memory_expr}` pinned to a free core; planning uses {gib(fallback_core_bytes(kind))} (LNC table)"
        )
    elif memory is None:
        found += f"; `{kind.memory_expr}` unreadable: planning falls back to {gib(fallback_core_bytes(kind))}"
    else:
        found += f"; {gib(memory)} per core (table fallback {gib(fallback_core_bytes(kind))})"
    return found, True


CHECK = Check(
    key="device",
    name="device available, core count",
    expected=expected,
    run=run,
    needs=("imports",),
    scripts=("evaluate",),
)
