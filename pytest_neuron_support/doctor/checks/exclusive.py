"""Check `exclusive`: a second process pinned to a core a first process holds fails at runtime init,
where the table says a core belongs to one process at a time."""

from __future__ import annotations

import time

from pytest_neuron_support.devices.table import DeviceKind
from pytest_neuron_support.doctor.check import ON_DEVICE, Check, Doctor


def is_exclusive(kind: DeviceKind) -> bool:
    """Whether a core belongs to one process at a time. The table has no field of its own for it: a kind
    that pins processes to cores AND lists cores' owning processes (``owners_command``: the ledger must
    not lease a core someone else holds) is one whose cores are owned exclusively; cuda pins but shares
    a GPU between processes, cpu pins nothing."""
    return kind.core_env_var is not None and kind.owners_command is not None


def expected(kind: DeviceKind) -> str:
    return (
        f"a second process pinned with {kind.core_env_var or '<core_env_var>'} to a core a first process "
        "holds fails at runtime init"
    )


def not_applicable(kind: DeviceKind) -> str | None:
    if is_exclusive(kind):
        return None
    return (
        f"{kind.name} cores are not exclusive by the table (core_env_var={kind.core_env_var}, "
        f"owners_command={kind.owners_command})"
    )


def run(doctor: Doctor) -> tuple[str, bool]:
    cores = doctor.free_cores(1)
    if cores is None:
        return "no free core in this session's slice", False
    ready, release = doctor.work_dir / "refused-ready", doctor.work_dir / "refused-release"
    holder = doctor.start(
        "holder",
        "hold",
        doctor.script_args(ready_file=str(ready), release_file=str(release), wait_s=0, hold_s=doctor.timeout),
        doctor.device_env(cores),
    )
    deadline = time.monotonic() + doctor.timeout
    try:
        while not ready.exists() and holder.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if not ready.exists():
            outcome = holder.wait(time.monotonic())
            return f"the first process could not hold {doctor.cores_text(cores)}: {outcome.error}", False
        second = doctor.run("second", "allocate", doctor.script_args(), doctor.device_env(cores))
    finally:
        release.touch()
        held = holder.wait(deadline + 30)
    if second.timed_out:
        return (
            f"the second process on {doctor.cores_text(cores)} neither failed nor finished within "
            f"{doctor.timeout:.0f} s: it waited for the core instead of being refused",
            False,
        )
    if second.error is None:
        return (
            f"the second process allocated on {second.get('device')} ({doctor.cores_text(cores)}) while the first "
            "held it: cores are not exclusive",
            False,
        )
    found = f"second on {doctor.cores_text(cores)} refused: {second.error}"
    if held.error is not None:
        return f"{found}; but the first failed too: {held.error}", False
    return found, True


CHECK = Check(
    key="exclusive",
    name="second process on a taken core refused",
    expected=expected,
    run=run,
    not_applicable=not_applicable,
    needs=ON_DEVICE,
    scripts=("hold", "allocate"),
)
