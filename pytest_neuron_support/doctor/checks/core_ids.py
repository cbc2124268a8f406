"""Check `core-ids`: the owners listing (``neuron-ls -j``, as the `owners` check read it) numbers cores
as the pinning does. The ledger marks the cores ``core_owners`` reads as owned and pins children
to pool numbers: if neuron-ls counted physical cores (8 a trn2 chip) where the runtime counts logical
ones (4 at LNC=2), it would mark and avoid the wrong cores."""

from __future__ import annotations

from collections.abc import Sequence

from pytest_neuron_support.devices.table import DeviceKind, logical_nc_config
from pytest_neuron_support.doctor.check import Check, Doctor, span
from pytest_neuron_support.doctor.checks import owners
from pytest_neuron_support.run.cores import parse_cores


def expected(kind: DeviceKind) -> str:
    return (
        "the owners listing's core ids are 0..N-1 and as many as device_count() (logical cores at this "
        "LNC, not physical); the pool's cores are among them"
    )


def run(doctor: Doctor) -> tuple[str, bool]:
    kind = doctor.kind
    pinned = next(
        (f"{v}={doctor.environ[v]}" for v in kind.visible_env_vars if doctor.environ.get(v, "").strip()), None
    )
    return core_numbering(doctor.owners_listing, doctor.count, doctor.slice, pinned, logical_nc_config(doctor.environ))


def core_numbering(listing: object, count: int, pool: Sequence[int], pinned: str | None, lnc: int) -> tuple[str, bool]:
    """Whether ``neuron-ls -j``'s core ids (``listing``, the layout the `owners` check accepted) number
    cores as the pinning does: ``count`` is ``device_count()`` in the doctor's environment (logical
    cores, LNC ``lnc``), ``pool`` this session's slice in host numbering, ``pinned`` the variable that
    restricted the doctor's own view (``NEURON_RT_VISIBLE_CORES=8-15``) or None. Returns (found, passed)."""
    devices = listing["neuron_devices"] if isinstance(listing, dict) else listing
    if not isinstance(devices, list):
        return f"no neuron-ls listing to compare (got {type(listing).__name__})", False
    ids = sorted({c for i, d in enumerate(devices) if isinstance(d, dict) for c in owners.device_cores(d, i)})
    per_device = sorted({len(owners.device_cores(d, i)) for i, d in enumerate(devices) if isinstance(d, dict)})
    listed = len(ids)
    found = (
        f"neuron-ls lists {listed} core id(s) ({span(ids)}; {'/'.join(map(str, per_device))} per device) over "
        f"{len(devices)} device(s); device_count() = {count}"
        + (f" under {pinned}" if pinned else " (unpinned)")
        + f"; LNC={lnc}; pool {span(pool)}"
    )
    problems = []
    if ids != list(range(listed)):
        problems.append(f"the ids are not 0..{listed - 1}, the zero-based numbering NEURON_RT_VISIBLE_CORES takes")
    if pinned is None and listed != count:
        if listed == count * lnc:
            problems.append(
                f"neuron-ls numbers PHYSICAL cores ({listed} = {count} logical x LNC {lnc}) where the pinning and "
                "device_count() number logical ones: owners would be marked on the wrong cores"
            )
        else:
            problems.append(f"{listed} listed != {count} visible to the runtime")
    if pinned is not None:
        # The runtime sees what its own variable names; the session's slice (NEURON_SUPPORT_VISIBLE_CORES)
        # may be narrower, and is checked against the listing below.
        named = parse_cores(pinned.partition("=")[2])
        if count != len(named):
            problems.append(f"device_count() = {count} under {pinned}, which names {len(named)} core(s)")
    outside = [c for c in pool if c not in set(ids)]
    if outside:
        problems.append(f"pool core(s) {span(outside)} are not listed by neuron-ls")
    if problems:
        return f"{found}: MISMATCH: " + "; ".join(problems), False
    return f"{found}: consistent", True


CHECK = Check(
    key="core-ids",
    name="neuron-ls core ids vs the pinning's",
    expected=expected,
    run=run,
    # It reads the listing the owners check read: where there is none, there is nothing to compare.
    not_applicable=owners.not_applicable,
    needs=("device", "slice", "owners"),
)
