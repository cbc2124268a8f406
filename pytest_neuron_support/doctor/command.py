"""``neuron-support doctor``: check, on this host, every assumption the harness makes about its device.

The neuron row of the device table is written from documentation and from a reading of torch-neuronx's
source (``shared/reference/torchneuron.md``); only a trn2 host can show whether it holds. Run this first
on a new host, a new Neuron SDK or a new runner image: it prints one row per assumption (check,
expected, found, status) and exits 1 when any fails, before a sweep spends hours on a broken premise.

Everything device-specific comes from the device table (:data:`~pytest_neuron_support.devices.table.DEVICES`):
a check that does not apply to a kind is decided by the table and reported as ``N/A`` with the field
that says so, never as a silent pass; a check whose prerequisite failed is ``NOT RUN``, with the
prerequisite named. Each check that touches the device runs in a short-lived subprocess of its own,
pinned to cores of this session's slice with the table's env applied, under a timeout: this process
never initialises the device (on neuron, a process that pins nothing reserves every core until it
exits). The checks' scripts and logs are kept in a work directory when anything fails.

This process imports neither torch nor transformers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Mapping
from datetime import datetime, timezone
from pathlib import Path

from pytest_neuron_support.base.storage import write_atomic
from pytest_neuron_support.devices.table import AUTO_ORDER, DEVICES, DeviceKind, ProbeResult, probe
from pytest_neuron_support.doctor.check import Check, Doctor
from pytest_neuron_support.doctor.registry import CHECKS
from pytest_neuron_support.doctor.report import FAIL, NA, NOT_RUN, OK, CheckResult, Report, format_table

#: Seconds each check may take (``--timeout``): a first neuronx-cc compile of a tiny graph takes tens of
#: seconds, the tiny generation compiles a decoding step.
DEFAULT_TIMEOUT_S = 600.0


def resolve_device(choice: str, timeout: float = DEFAULT_TIMEOUT_S) -> tuple[str, ProbeResult | None]:
    """``--device`` to a kind, probing (in a subprocess) only for ``auto``; a probe that fails resolves
    to cpu, where the device check then says why."""
    if choice != "auto":
        return choice, None
    try:
        seen = probe(AUTO_ORDER, timeout=timeout)
    except Exception:
        return "cpu", None
    return seen.resolve("auto"), seen


def selected_checks(only: Collection[str] | None = None) -> tuple[Check, ...]:
    """The checks ``only`` names (keys) and every check they need, in table order; all when None."""
    if not only:
        return CHECKS
    by_key = {c.key: c for c in CHECKS}
    unknown = sorted(set(only) - set(by_key))
    if unknown:
        raise ValueError(f"unknown check(s) {', '.join(unknown)}; choose from {', '.join(by_key)}")
    wanted: set[str] = set()
    pending = list(only)
    while pending:
        key = pending.pop()
        if key not in wanted:
            wanted.add(key)
            pending.extend(by_key[key].needs)
    return tuple(c for c in CHECKS if c.key in wanted)


def run_doctor(
    kind: DeviceKind,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    environ: Mapping[str, str] | None = None,
    probed: ProbeResult | None = None,
    progress: Callable[[CheckResult], None] | None = None,
    only: Collection[str] | None = None,
) -> Report:
    """Run the checks for ``kind`` (all, or ``only`` those keys and what they need) and return the report;
    the work directory is removed when every check passed. ``environ`` is the environment the checks
    see (default this process's): the session's slice, a compile cache directory, PATH."""
    checks = selected_checks(only)
    work_dir = Path(tempfile.mkdtemp(prefix=f"neuron-support-doctor-{kind.name}-"))
    doctor = Doctor(
        kind,
        timeout=timeout,
        work_dir=work_dir,
        environ=dict(os.environ if environ is None else environ),
        probed=probed,
    )
    results: dict[str, CheckResult] = {}
    for check in checks:
        start = time.monotonic()
        reason = check.not_applicable(kind)
        unmet = [results[key] for key in check.needs if results[key].status != OK]
        if reason is not None:
            status, found = NA, f"does not apply: {reason}"
        elif unmet:
            # Name the prerequisites that failed (the root cause), not the ones that were not run because of them.
            roots = [u for u in unmet if u.status == FAIL] or unmet
            status = NOT_RUN
            found = "not run: needs " + ", ".join(f"`{u.key}` ({u.name}), which is {u.status}" for u in roots)
        else:
            try:
                found, passed = check.run(doctor)
            except Exception as exc:  # a check's own bug must not hide the other rows
                found, passed = f"the check itself failed: {type(exc).__name__}: {exc}", False
            status = OK if passed else FAIL
        result = CheckResult(
            check.key, check.name, check.expected(kind), found, status, round(time.monotonic() - start, 2)
        )
        results[check.key] = result
        if progress is not None:
            progress(result)
    report = Report(
        device=kind.name,
        checks=tuple(results.values()),
        versions=dict(doctor.versions, python=doctor.versions.get("python", platform.python_version())),
        timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        work_dir=str(work_dir),
    )
    if report.passed:
        shutil.rmtree(work_dir, ignore_errors=True)
    return report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The doctor's options (``neuron-support doctor`` and ``python -m pytest_neuron_support.doctor``)."""
    parser.add_argument(
        "--device",
        choices=("auto", *DEVICES),
        default="auto",
        help="device kind to check (default auto: the first of neuron, cuda, cpu that reports a core)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help=f"seconds each check may take (default {DEFAULT_TIMEOUT_S:.0f})",
    )
    parser.add_argument(
        "--only",
        action="append",
        metavar="CHECK",
        choices=[c.key for c in CHECKS],
        help="run only this check and the checks it needs (repeatable): " + ", ".join(c.key for c in CHECKS),
    )


def main(args: argparse.Namespace) -> int:
    """Run the doctor; print the table and a summary; 0 when every check is OK or N/A, else 1."""
    if args.timeout <= 0:
        print(f"neuron-support doctor: --timeout must be positive (got {args.timeout})", file=sys.stderr)
        return 2
    only = getattr(args, "only", None)
    checks = selected_checks(only)
    name, probed = resolve_device(args.device, args.timeout)
    kind = DEVICES[name]
    print(f"neuron-support doctor: checking {name} (--device {args.device}); {len(checks)} checks", flush=True)
    done = 0

    def progress(result: CheckResult) -> None:
        nonlocal done
        done += 1
        print(
            f"  [{done:>2}/{len(checks)}] {result.key}: {result.name}: {result.status} ({result.seconds:.1f} s)",
            flush=True,
        )

    report = run_doctor(kind, timeout=args.timeout, probed=probed, progress=progress, only=only)
    print()
    print(format_table(report.checks))
    print()
    if not report.passed:
        print(f"scripts and logs of the checks: {report.work_dir}")
    if args.json:
        write_atomic(Path(args.json), json.dumps(report.to_json(), indent=2) + "\n")
    print(report.summary())
    return 0 if report.passed else 1
