"""Check `two-processes`: two processes pinned to distinct cores of the slice both take the device and
hold it at the same time (as a session's concurrent runs do)."""

from __future__ import annotations

import time

from pytest_neuron_support.devices.table import DeviceKind
from pytest_neuron_support.doctor.check import ON_DEVICE, Check, Doctor, span

#: How long the two processes hold their cores once both are ready.
HOLD_S = 2.0


def expected(kind: DeviceKind) -> str:
    return (
        f"two processes pinned to distinct cores ({kind.core_env_var or 'no pinning variable'}) both "
        f"allocate and hold the device {HOLD_S:.0f} s, overlapping"
    )


def run(doctor: Doctor) -> tuple[str, bool]:
    free = [c for c in doctor.slice if c not in doctor.owned]
    if len(free) < 2:
        return f"this session's free cores are {span(free)}: two are needed", False
    first, second = (free[0],), (free[1],)
    ready = [doctor.work_dir / f"two-ready-{i}" for i in (0, 1)]
    release = doctor.work_dir / "two-release"
    procs = [
        doctor.start(
            f"hold-{i}",
            "hold",
            doctor.script_args(
                ready_file=str(ready[i]),
                wait_for=str(ready[1 - i]),
                release_file=str(release),
                wait_s=doctor.timeout,
                hold_s=HOLD_S,
            ),
            doctor.device_env(cores),
        )
        for i, cores in enumerate((first, second))
    ]
    deadline = time.monotonic() + doctor.timeout
    # One that ends before both hold their cores has failed: let the other stop waiting for it.
    while not all(r.exists() for r in ready) and time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            release.touch()
            break
        time.sleep(0.05)
    outcomes = [p.wait(deadline) for p in procs]
    texts = []
    for cores, outcome in zip((first, second), outcomes, strict=True):
        texts.append(f"{doctor.cores_text(cores)}: {outcome.error or 'held ' + str(outcome.get('device'))}")
    if any(o.error is not None for o in outcomes):
        return "; ".join(texts), False
    overlap = min(float(o.get("done")) for o in outcomes) - max(float(o.get("ready")) for o in outcomes)
    both = all(o.get("partner_ready") for o in outcomes)
    return f"{'; '.join(texts)}; both held at once for {overlap:.1f} s", both and overlap > 0


CHECK = Check(
    key="two-processes",
    name="two 1-core processes at once",
    expected=expected,
    run=run,
    needs=ON_DEVICE,
    scripts=("hold",),
)
