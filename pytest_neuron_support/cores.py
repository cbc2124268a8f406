"""Leasing cores to items across processes, so parallel workers never share one.

A ledger (a JSON file guarded by a file lock, in a directory the whole session shares) holds
the current leases. An item acquires a contiguous, aligned range of ``count`` cores (the Neuron
runtime takes ``NEURON_RT_VISIBLE_CORES`` as a contiguous range, and aligned ranges keep a
multi-core lease on as few chips as possible), blocks while too few are free, and releases
it when it ends. A lease records its holder's pid: a worker that died (SIGKILL, segfault)
cannot release, so any acquirer drops leases of dead holders before it looks for space.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

LEDGER = "leases.json"


@dataclass(frozen=True)
class Lease:
    """Cores ``first .. first + count - 1`` held by process ``pid`` for item ``holder``.

    Attributes:
        first: first core index in the pool.
        count: number of cores.
        pid: holder process id (liveness is checked by other acquirers).
        holder: who holds it (the item's node id), for humans reading the ledger.
        key: unique id of this lease.
        acquired: wall-clock time (epoch seconds) it was granted.
    """

    first: int
    count: int
    pid: int
    holder: str
    key: str
    acquired: float

    @property
    def cores(self) -> range:
        return range(self.first, self.first + self.count)


class LeaseTooLarge(ValueError):
    """More cores asked for than the pool has: waiting would never end."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie holds no cores; its parent just has not reaped it yet
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True


class CorePool:
    """The session's pool of ``size`` cores, shared through ``directory``."""

    def __init__(self, directory: Path, size: int) -> None:
        self.directory = directory
        self.size = size
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock = FileLock(str(directory / f"{LEDGER}.lock"))
        self._path = directory / LEDGER

    def _read(self) -> list[Lease]:
        try:
            data = json.loads(self._path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return []
        return [Lease(**entry) for entry in data["leases"]]

    def _write(self, leases: list[Lease]) -> None:
        tmp = self._path.with_suffix(f".{uuid.uuid4().hex}.tmp")
        tmp.write_text(json.dumps({"size": self.size, "leases": [lease.__dict__ for lease in leases]}))
        os.replace(tmp, self._path)

    def leases(self) -> list[Lease]:
        """Current leases of live holders."""
        with self._lock:
            return [lease for lease in self._read() if _alive(lease.pid)]

    def _place(self, leases: list[Lease], count: int) -> int | None:
        busy = {core for lease in leases for core in lease.cores}
        for first in range(0, self.size - count + 1, count):  # aligned first fit
            if busy.isdisjoint(range(first, first + count)):
                return first
        return None

    def try_acquire(self, count: int, holder: str = "", pid: int | None = None) -> Lease | None:
        """Take ``count`` contiguous cores now, or return None if they are not free."""
        if count > self.size:
            raise LeaseTooLarge(f"{count} cores asked for, the pool has {self.size}")
        with self._lock:
            leases = [lease for lease in self._read() if _alive(lease.pid)]
            first = self._place(leases, count)
            if first is None:
                return None
            lease = Lease(first, count, os.getpid() if pid is None else pid, holder, uuid.uuid4().hex, time.time())
            self._write([*leases, lease])
            return lease

    def acquire(self, count: int, holder: str = "", poll: float = 0.2, timeout: float | None = None) -> Lease:
        """Block until ``count`` contiguous cores are free, then take them."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            lease = self.try_acquire(count, holder)
            if lease is not None:
                return lease
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"no {count} contiguous free cores within {timeout}s")
            time.sleep(poll)

    def release(self, lease: Lease) -> None:
        with self._lock:
            self._write([held for held in self._read() if held.key != lease.key and _alive(held.pid)])

    @contextlib.contextmanager
    def lease(self, count: int, holder: str = "") -> Iterator[Lease]:
        """Hold ``count`` cores for the duration of the block."""
        lease = self.acquire(count, holder)
        try:
            yield lease
        finally:
            self.release(lease)
