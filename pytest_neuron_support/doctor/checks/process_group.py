"""Check `process-group`: two spawned ranks, one core each, join a process group on the device's
backend with run.py's own launcher and rendezvous (templates/common.py, spliced into the script),
before any seeding, and ``all_reduce`` on the device."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_neuron_support.devices.table import DeviceKind
from pytest_neuron_support.doctor.check import ON_DEVICE, Check, Doctor, span


def expected(kind: DeviceKind) -> str:
    return (
        f"spawned ranks, one core each, init_process_group({kind.dist_backend!r}) before seeding, "
        "all_reduce on the device = 3"
    )


def run(doctor: Doctor) -> tuple[str, bool]:
    kind = doctor.kind
    cores = doctor.free_cores(2)
    if cores is None:
        free = [c for c in doctor.slice if c not in doctor.owned]
        return f"this session's free cores are {span(free)}: two adjacent ones are needed", False
    args = doctor.script_args(backend=kind.dist_backend, root_comm_env=kind.root_comm_env)
    outcome = doctor.run("process-group", "process_group", args, doctor.device_env(cores))
    if outcome.error is not None:
        return f"{doctor.cores_text(cores)}: {outcome.error}", False
    ranks: list[Mapping[str, Any]] = list(outcome.get("ranks", []))
    texts, passed = [], True
    for rank in ranks:
        pinned = f" ({kind.core_env_var}={rank.get('pinned')})" if kind.core_env_var else ""
        if "error" in rank:
            texts.append(f"rank {rank.get('rank')}{pinned}: {rank['error']}")
            passed = False
            continue
        values = rank.get("sum") or []
        comm = f", {kind.root_comm_env}={rank.get('root_comm')}" if kind.root_comm_env else ""
        texts.append(f"rank {rank.get('rank')}{pinned}{comm} on {rank.get('device')}: sum {values[:1]}")
        passed = passed and values == [3.0] * 4
    if kind.core_env_var and len({r.get("pinned") for r in ranks}) != len(ranks):
        texts.append("ranks were NOT pinned to distinct cores")
        passed = False
    if outcome.get("spawn_error") and passed:
        texts.append(f"spawn: {outcome.get('spawn_error')}")
        passed = False
    return f"{kind.dist_backend}: " + "; ".join(texts), passed and len(ranks) == 2


CHECK = Check(
    key="process-group",
    name="2-rank process group",
    expected=expected,
    run=run,
    needs=ON_DEVICE,
    scripts=("process_group",),
)
