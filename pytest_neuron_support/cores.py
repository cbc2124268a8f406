"""Leasing cores to items across processes, so parallel workers never share one.

A ledger (a JSON file guarded by a file lock, in a directory the whole session shares) holds
the current leases. An item acquires a contiguous, aligned range of ``count`` cores (the Neuron
runtime takes ``NEURON_RT_VISIBLE_CORES`` as a contiguous range, and aligned ranges keep a
multi-core lease on as few chips as possible), blocks while too few are free, and releases
it when it ends. A lease records its holder's pid: a worker that died (SIGKILL, segfault)
cannot release, so any acquirer drops leases of dead holders before it looks for space.

Waiting requests are queued in the ledger with a priority (the sweep passes each item's cost,
cores x expected seconds, so the largest work starts first). Requests are considered in
priority order: a request is granted only where it fits once the cores of every request
ahead of it are set aside, either the cores that request is about to take, or, when it does
not fit yet, the aligned block it is waiting to drain. Smaller requests still backfill cores
outside those blocks, so a 4-core item is not starved by a stream of 1-core items and the
pool does not sit idle while it waits.
"""

from __future__ import annotations

import contextlib
import dataclasses
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


@dataclass(frozen=True)
class Waiter:
    """A request queued for cores.

    Attributes:
        key: unique id of the request.
        count: cores asked for.
        pid: the waiting process (a dead one's request is dropped).
        priority: larger goes first; ties go to the earlier request.
        since: wall-clock time (epoch seconds) it was queued.
    """

    key: str
    count: int
    pid: int
    priority: float
    since: float


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

    def _read(self) -> tuple[list[Lease], list[Waiter]]:
        """Live leases and live waiters (entries of dead processes are dropped)."""
        try:
            data = json.loads(self._path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return [], []
        leases = [Lease(**entry) for entry in data["leases"]]
        waiters = [Waiter(**entry) for entry in data.get("waiting", [])]
        return [x for x in leases if _alive(x.pid)], [w for w in waiters if _alive(w.pid)]

    def _write(self, leases: list[Lease], waiters: list[Waiter]) -> None:
        tmp = self._path.with_suffix(f".{uuid.uuid4().hex}.tmp")
        data = {
            "size": self.size,
            "leases": [dataclasses.asdict(x) for x in leases],
            "waiting": [dataclasses.asdict(w) for w in waiters],
        }
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self._path)

    def leases(self) -> list[Lease]:
        """Current leases of live holders."""
        with self._lock:
            return self._read()[0]

    def waiting(self) -> list[Waiter]:
        """Requests of live processes still waiting for cores, first in line first."""
        with self._lock:
            return sorted(self._read()[1], key=_order)

    def _blocks(self, count: int) -> range:
        return range(0, self.size - count + 1, count)  # aligned starts

    def _place(self, busy: set[int], count: int) -> int | None:
        for first in self._blocks(count):  # aligned first fit
            if busy.isdisjoint(range(first, first + count)):
                return first
        return None

    def _grant(self, leases: list[Lease], waiters: list[Waiter], key: str) -> int | None:
        """Where request ``key`` may start now, honouring every request ahead of it; None to wait."""
        busy = {core for lease in leases for core in lease.cores}
        set_aside: set[int] = set()
        for waiter in sorted(waiters, key=_order):
            first = self._place(busy | set_aside, waiter.count)
            if waiter.key == key:
                return first
            if first is None:
                # It waits for the aligned block closest to free: keep that block draining.
                first = min(self._blocks(waiter.count), key=lambda f: (len(busy & set(range(f, f + waiter.count))), f))
            set_aside |= set(range(first, first + waiter.count))
        raise KeyError(key)

    def try_acquire(
        self, count: int, holder: str = "", pid: int | None = None, priority: float = 0.0, ticket: str | None = None
    ) -> Lease | None:
        """Take ``count`` contiguous cores now, or return None and keep the request queued.

        ``ticket`` identifies a request across attempts (its place in line); a call without
        one asks once and leaves nothing queued.
        """
        if count > self.size:
            raise LeaseTooLarge(f"{count} cores asked for, the pool has {self.size}")
        me = os.getpid() if pid is None else pid
        with self._lock:
            leases, waiters = self._read()
            key = ticket or uuid.uuid4().hex
            if not any(w.key == key for w in waiters):
                waiters.append(Waiter(key, count, me, priority, time.time()))
            first = self._grant(leases, waiters, key)
            if first is None:
                if ticket is not None:  # stay in line
                    self._write(leases, waiters)
                return None
            lease = Lease(first, count, me, holder, uuid.uuid4().hex, time.time())
            self._write([*leases, lease], [w for w in waiters if w.key != key])
            return lease

    def acquire(
        self, count: int, holder: str = "", poll: float = 0.2, timeout: float | None = None, priority: float = 0.0
    ) -> Lease:
        """Block until ``count`` contiguous cores are granted in priority order, then take them."""
        deadline = None if timeout is None else time.monotonic() + timeout
        ticket = uuid.uuid4().hex
        try:
            while True:
                lease = self.try_acquire(count, holder, priority=priority, ticket=ticket)
                if lease is not None:
                    return lease
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"no {count} contiguous free cores within {timeout}s")
                time.sleep(poll)
        except BaseException:
            self._leave(ticket)  # interrupted or timed out: do not hold the line for others
            raise

    def _leave(self, ticket: str) -> None:
        with self._lock:
            leases, waiters = self._read()
            self._write(leases, [w for w in waiters if w.key != ticket])

    def release(self, lease: Lease) -> None:
        with self._lock:
            leases, waiters = self._read()
            self._write([held for held in leases if held.key != lease.key], waiters)

    @contextlib.contextmanager
    def lease(self, count: int, holder: str = "", priority: float = 0.0) -> Iterator[Lease]:
        """Hold ``count`` cores for the duration of the block."""
        lease = self.acquire(count, holder, priority=priority)
        try:
            yield lease
        finally:
            self.release(lease)


def _order(waiter: Waiter) -> tuple[float, float, str]:
    return (-waiter.priority, waiter.since, waiter.key)
