"""Check `compile-cache`: the compile cache directory (``compile_cache_env``) is writable, and after one
compile the cache's counters count it; the files the compile wrote are listed, so the cache's on-disk
layout can be read off the table."""

from __future__ import annotations

from pytest_neuron_support.devices.table import DeviceKind
from pytest_neuron_support.doctor.check import ON_DEVICE, Check, Doctor, env_text


def expected(kind: DeviceKind) -> str:
    return f"{kind.compile_cache_env} writable; after a compile, " + (
        f"`{kind.cache_stats_expr}` persistent_hits + persistent_misses >= 1"
        + (f" ({env_text(kind.env)})" if kind.env else "")
        + ", or the row says the counters are UNAVAILABLE on this wheel"
        if kind.cache_stats_expr
        else "inductor's fxgraph_cache_hit + fxgraph_cache_miss >= 1"
    )


def run(doctor: Doctor) -> tuple[str, bool]:
    cores = doctor.free_cores(1)
    if cores is None:
        return "no free core in this session's slice", False
    kind = doctor.kind
    args = doctor.script_args(
        backend=kind.compile_backend, cache_dir=doctor.cache_dir, cache_stats_expr=kind.cache_stats_expr
    )
    outcome = doctor.run("cache", "compile_cache", args, doctor.device_env(cores))
    where = f"{kind.compile_cache_env}={doctor.cache_dir}"
    if outcome.error is not None:
        return f"{where}: {outcome.error}", False
    written = outcome.get("written", [])
    shown = ", ".join(written[:2]) + (f" (+{len(written) - 2} more)" if len(written) > 2 else "")
    wrote = f"wrote {len(written)} file(s)" + (f": {shown}" if written else "")
    unavailable = outcome.get("unavailable")
    if unavailable is not None:
        # The runs go on without counters (rows record them as unknown), so this alone is no reason to
        # stop a sweep (a FAIL stops the shard); the row says so in capitals instead.
        found = (
            f"{where}: writable; counters UNAVAILABLE on this wheel (`{kind.cache_stats_expr}` raises "
            f"{unavailable}): rows record persistent_cache_hits/misses as unknown; {wrote}"
        )
        return found, True
    hits, misses = int(outcome.get("hits", 0)), int(outcome.get("misses", 0))
    found = f"{where}: writable; one compile counted {hits} hit(s), {misses} miss(es); {wrote}"
    return found, hits + misses >= 1


CHECK = Check(
    key="compile-cache",
    name="compile cache dir and counters",
    expected=expected,
    run=run,
    needs=ON_DEVICE,
    scripts=("compile_cache",),
)
