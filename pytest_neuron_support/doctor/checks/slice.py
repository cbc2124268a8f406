"""Check `slice`: this session's cores (``NEURON_SUPPORT_VISIBLE_CORES`` or the device's own visibility
variables) are readable, not empty, and a range where the pinning variable takes only a range."""

from __future__ import annotations

from pytest_neuron_support.devices.table import DeviceKind
from pytest_neuron_support.doctor.check import Check, Doctor, span
from pytest_neuron_support.run.cores import session_cores


def expected(kind: DeviceKind) -> str:
    return (
        "session_cores("
        + ", ".join(("NEURON_SUPPORT_VISIBLE_CORES", *kind.visible_env_vars))
        + ") readable, non-empty"
        + (f", contiguous ({kind.core_env_var} takes a range)" if kind.core_env_contiguous else "")
    )


def run(doctor: Doctor) -> tuple[str, bool]:
    kind = doctor.kind
    reported = kind.max_pool or doctor.count
    try:
        doctor.slice = session_cores(kind.visible_env_vars, reported, doctor.environ)
    except ValueError as exc:
        return f"unreadable: {exc}", False
    source = next(
        (
            f"{n}={doctor.environ[n]}"
            for n in ("NEURON_SUPPORT_VISIBLE_CORES", *kind.visible_env_vars)
            if doctor.environ.get(n, "").strip()
        ),
        f"all {reported} reported",
    )
    found = f"cores {span(doctor.slice)} ({len(doctor.slice)}, from {source})"
    if not doctor.slice:
        return f"{found}: empty", False
    contiguous = list(doctor.slice) == list(range(doctor.slice[0], doctor.slice[-1] + 1))
    if kind.core_env_contiguous:
        if not contiguous:
            return f"{found}: NOT contiguous, but {kind.core_env_var} takes only a range", False
        return f"{found}; contiguous", True
    why = f"{kind.core_env_var} takes a list" if kind.core_env_var else "no pinning variable"
    return f"{found}; contiguity not required ({why})", True


CHECK = Check(
    key="slice",
    name="this session's visible slice",
    expected=expected,
    run=run,
    needs=("imports", "device"),
)
