"""Check `compiler`: the device compiler's version, read as the harness reads it (its local label
kept), and the NEFF bucket prefix it maps to (what ``neuron-support neff pull/push`` sync)."""

from __future__ import annotations

from pytest_neuron_support.devices.table import DeviceKind
from pytest_neuron_support.doctor.check import Check, Doctor


def expected(kind: DeviceKind) -> str:
    return (
        f"`{kind.compiler_version_expr or '<compiler_version_expr>'}` readable (local label kept) and "
        "mapped to a NEFF bucket prefix by run.neffcache.sync_command"
    )


def not_applicable(kind: DeviceKind) -> str | None:
    if kind.compiler_version_expr is not None:
        return None
    return f"{kind.name} has no compiler of its own (compiler_version_expr is None)"


def run(doctor: Doctor) -> tuple[str, bool]:
    # Imported here: only this check needs them.
    from pytest_neuron_support.devices.table import compiler_version
    from pytest_neuron_support.run.neffcache import sync_command

    kind = doctor.kind
    version = compiler_version(kind, python=doctor.python, timeout=doctor.timeout)
    if version == "none":
        # compiler_version says "none" on any failure: show the error once.
        why = doctor.run("compiler", "evaluate", {"expr": kind.compiler_version_expr}, doctor.cpu_env())
        return f"`{kind.compiler_version_expr}`: {why.error or why.get('value')}", False
    doctor.versions["compiler"] = version
    command = sync_command(version)
    if command is None:
        return f"{version}; no NEFF bucket prefix for it", False
    prefix = command.split()[3] if len(command.split()) > 3 else command
    return f"{version}; bucket prefix {prefix}", True


CHECK = Check(
    key="compiler",
    name="compiler version, NEFF bucket prefix",
    expected=expected,
    run=run,
    not_applicable=not_applicable,
    scripts=("evaluate",),
)
