"""What a doctor check is (:class:`Check`: its row and its runner) and what its runner works with
(:class:`Doctor`: the state one doctor run builds up, check by check, and how a check starts its
scripts in subprocesses pinned to cores of this session's slice).

Each check lives in a module of its own under ``doctor/checks/`` (its row, its runner), its
subprocess scripts under ``doctor/scripts/``; ``doctor/registry.py`` lists the checks in order.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_neuron_support.devices.table import DEVICES, NO_DEVICE_ENV, DeviceKind, ProbeResult
from pytest_neuron_support.doctor.render import render
from pytest_neuron_support.doctor.runner import Outcome, Running

#: What a check that runs on a core of this session's slice needs to have passed first.
ON_DEVICE: tuple[str, ...] = ("imports", "device", "slice")


def applies(kind: DeviceKind) -> str | None:
    """The ``not_applicable`` of a check every kind runs."""
    return None


@dataclass(frozen=True)
class Check:
    """One check: its row of the doctor's table and its runner.

    Attributes:
        key: stable identifier (``memory``, ``process-group``...): the table, the JSON report,
            ``--only`` and the docs name the check by it.
        name: the row's title.
        expected: what is assumed, for a kind (from its table fields).
        run: the check itself, on one run's :class:`Doctor`: (found, passed).
        not_applicable: why the check does not apply to a kind, from the table, or None where it does.
        needs: keys of checks that must have passed (OK) for this one to say anything; earlier rows.
        scripts: the scripts (``doctor/scripts/<name>.py``) the runner renders and starts.
    """

    key: str
    name: str
    expected: Callable[[DeviceKind], str]
    run: Callable[[Doctor], tuple[str, bool]]
    not_applicable: Callable[[DeviceKind], str | None] = applies
    needs: tuple[str, ...] = ()
    scripts: tuple[str, ...] = ()


def gib(nbytes: int) -> str:
    return f"{nbytes / (1 << 30):.1f} GiB"


def span(cores: Sequence[int]) -> str:
    """Cores as the table shows them: ``4-7`` for a range, ``1,3`` otherwise, ``none``."""
    if not cores:
        return "none"
    if list(cores) == list(range(cores[0], cores[-1] + 1)):
        return str(cores[0]) if len(cores) == 1 else f"{cores[0]}-{cores[-1]}"
    return ",".join(map(str, cores))


def env_text(env: Mapping[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in env.items())


class Doctor:
    """The state one doctor run builds up, check by check (what the device, slice and owners checks
    found, versions), and how a check starts its scripts."""

    def __init__(
        self,
        kind: DeviceKind,
        *,
        timeout: float,
        work_dir: Path,
        environ: Mapping[str, str],
        probed: ProbeResult | None = None,
        python: str = sys.executable,
    ) -> None:
        self.kind = kind
        self.timeout = timeout
        self.work_dir = work_dir
        self.environ = dict(environ)
        self.python = python
        self.probed = probed
        #: Cores the device reports (the `device` check).
        self.count = 0
        #: This session's cores, host numbering (the `slice` check).
        self.slice: tuple[int, ...] = ()
        #: Cores other processes hold, and the listing they were read from (the `owners` check).
        self.owned: Mapping[int, int] = {}
        self.owners_listing: object = None
        #: Whether bf16 works on the device (the `bf16` check): the tiny generation's dtype.
        self.bf16 = False
        self.versions: dict[str, str] = {}
        self.cache_dir = self.environ.get(kind.compile_cache_env) or str(work_dir / "compile-cache")
        self._serial = 0

    def device_env(self, cores: Sequence[int]) -> dict[str, str]:
        """A device process's environment: the table's env (and its one-rank env where the process
        holds at most one core; the user's own values win, as in run.py), pinned to ``cores`` (host
        numbering, contiguous), the compile cache directory."""
        env = {**self.kind.env_for(len(cores)), **self.environ}
        if cores:
            env.update(self.kind.pin_cores(cores[0], len(cores)))
        env[self.kind.compile_cache_env] = self.cache_dir
        return env

    def cpu_env(self) -> dict[str, str]:
        """A process that must not touch the device: no pinning, no device backend autoloaded."""
        pins = {k.core_env_var for k in DEVICES.values() if k.core_env_var}
        return {**{k: v for k, v in self.environ.items() if k not in pins}, **NO_DEVICE_ENV}

    def script_args(self, **extra: Any) -> dict[str, Any]:
        """A script's SPEC: the device fields every device script reads, and ``extra``."""
        return {
            "device": self.kind.device_map,
            "memory_module": self.kind.memory_module,
            "core_env_var": self.kind.core_env_var,
            **extra,
        }

    def start(self, label: str, script: str, args: Mapping[str, Any], env: Mapping[str, str]) -> Running:
        """Render ``scripts/<script>.py`` with ``args`` into the work directory as ``NN-<label>.py`` (its
        result and log beside it) and start it."""
        self._serial += 1
        stem = f"{self._serial:02d}-{label}"
        path = self.work_dir / f"{stem}.py"
        path.write_text(render(script, args, file=path.name), encoding="utf-8")
        return Running(path, self.work_dir / f"{stem}.json", self.work_dir / f"{stem}.log", env, self.python)

    def run(self, label: str, script: str, args: Mapping[str, Any], env: Mapping[str, str]) -> Outcome:
        """:meth:`start`, and wait for it up to the timeout."""
        return self.start(label, script, args, env).wait(time.monotonic() + self.timeout)

    def free_cores(self, count: int) -> tuple[int, ...] | None:
        """``count`` cores of this session's slice that no process outside it holds, contiguous in host
        numbering (a pinning variable may take only a range), or None when the slice has none."""
        free = [c for c in self.slice if c not in self.owned]
        for index in range(len(free) - count + 1):
            block = free[index : index + count]
            if block[-1] - block[0] == count - 1:
                return tuple(block)
        return None

    def cores_text(self, cores: Sequence[int]) -> str:
        pin = self.kind.pin_cores(cores[0], len(cores)) if cores else {}
        return ", ".join(f"{k}={v}" for k, v in pin.items()) or "no pinning"
