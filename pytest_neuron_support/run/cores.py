"""Leasing cores to items across processes, so parallel workers and sessions never share one.

A ledger (a JSON file per device kind, guarded by a file lock, in a directory every pytest session
on the host finds: :func:`default_ledger_dir`, ``--core-ledger`` or ``NEURON_SUPPORT_CORE_LEDGER``)
holds the current leases of every session on the host. Cores are numbered as the host numbers
them: a session started with a slice of the host (``NEURON_RT_VISIBLE_CORES=8-15``, see
:func:`session_cores`) leases only inside it, and ``--neuron-cores N`` caps how many of them it
holds at once. Cores a process outside the ledger owns (another tool, another runner that does not
use it; on neuron, what ``neuron-ls`` reports) are not leased either.

An item acquires a contiguous, aligned range of ``count`` cores (the Neuron runtime takes
``NEURON_RT_VISIBLE_CORES`` as a contiguous range, and aligned ranges keep a multi-core lease on as
few chips as possible), blocks while too few are free, and releases it when it ends. A lease records
its holder's pid: a worker that died (SIGKILL, segfault) cannot release, so any acquirer drops
leases of dead holders before it looks for space.

Waiting requests are queued in the ledger with a priority (the sweep passes each item's cost,
cores x expected seconds, so the largest work starts first). Requests are considered in
priority order: a request is granted only where it fits once the cores of every request
ahead of it are set aside, either the cores that request is about to take, or, when it does
not fit yet, the aligned block it is waiting to drain. Smaller requests still backfill cores
outside those blocks, so a 4-core item is not starved by a stream of 1-core items and the
pool does not sit idle while it waits. ``acquire`` queues a request before it first considers it
(one poll later), so requests that arrive together are ordered by priority too. The queue orders
the requests of one session; sessions share the host's cores through the leases themselves.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from pytest_neuron_support.base.storage import write_atomic

LEDGER = "leases.json"
#: Overrides where the host-wide ledger lives (tests give each session-sharing experiment its own).
LEDGER_ENV = "NEURON_SUPPORT_CORE_LEDGER"
#: A slice of the host's cores for this session on any device kind (host numbering, ``i``, ``i-j``
#: or a comma list), read before the kind's own variable (``NEURON_RT_VISIBLE_CORES`` ...).
SLICE_ENV = "NEURON_SUPPORT_VISIBLE_CORES"


def default_ledger_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """Where every session on this host keeps its leases: fixed per host, overridable."""
    override = environ.get(LEDGER_ENV)
    return Path(override) if override else Path(tempfile.gettempdir()) / "neuron-support-cores"


def parse_cores(text: str) -> tuple[int, ...]:
    """Core ids from ``"3"``, ``"8-15"`` or ``"0,1,4-5"`` (host numbering), in order, no repeats."""
    cores: list[int] = []
    for part in text.replace(" ", "").split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if match is None:
            raise ValueError(f"{text!r} is not a core list; write e.g. 8-15 or 0,1,2")
        low, high = int(match.group(1)), int(match.group(2) or match.group(1))
        if high < low:
            raise ValueError(f"{text!r}: range {part} runs backwards; write {high}-{low}")
        cores.extend(c for c in range(low, high + 1) if c not in cores)
    return tuple(cores)


def session_cores(env_vars: Sequence[str], reported: int, environ: Mapping[str, str] = os.environ) -> tuple[int, ...]:
    """The host cores this session may use: the slice its parent gave it (:data:`SLICE_ENV`, then the
    device's own visibility variables), else every core the device reports, ``0 .. reported-1``."""
    for name in (SLICE_ENV, *env_vars):
        value = environ.get(name, "").strip()
        if value:
            try:
                return parse_cores(value)
            except ValueError as exc:
                raise ValueError(f"{name}={value}: {exc}") from None
    return tuple(range(reported))


@dataclass(frozen=True)
class Lease:
    """Cores ``first .. first + count - 1`` held by process ``pid`` for item ``holder``.

    Attributes:
        first: first core, in the host's numbering.
        count: number of cores.
        pid: holder process id (liveness is checked by other acquirers).
        holder: who holds it (the item's node id), for humans reading the ledger.
        key: unique id of this lease.
        acquired: wall-clock time (epoch seconds) it was granted.
        session: the pytest session that holds it (its cap on cores counts its own leases only).
    """

    first: int
    count: int
    pid: int
    holder: str
    key: str
    acquired: float
    session: str = ""

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
        session: the pytest session asking (requests are ordered within a session).
    """

    key: str
    count: int
    pid: int
    priority: float
    since: float
    session: str = ""


class LeaseTooLarge(ValueError):
    """More cores asked for than the pool has: waiting would never end."""


#: Which processes own each host core right now, every one of them (device-specific; see neuron_owners).
#: Several processes can be listed for the cores of one chip: one foreign owner among them makes a
#: core taken, whichever the listing names last.
Owners = Callable[[], Mapping[int, Collection[int]]]


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
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
    """A session's view of the host's cores, shared through the ledger in ``directory``.

    ``cores`` is the session's slice in host numbering (an int n means ``0 .. n-1``); ``limit`` caps
    the cores this session holds at once (``--neuron-cores``, default the whole slice); ``device``
    names the ledger file (cpu slots and neuron cores are different things); ``owners`` reports
    cores owned by processes outside the ledger, which are not leased while they are held.
    """

    def __init__(
        self,
        directory: Path,
        cores: int | Sequence[int],
        *,
        limit: int | None = None,
        session: str | None = None,
        device: str = "",
        owners: Owners | None = None,
    ) -> None:
        self.directory = directory
        self.cores: tuple[int, ...] = tuple(range(cores)) if isinstance(cores, int) else tuple(cores)
        self.limit = len(self.cores) if limit is None else min(limit, len(self.cores))
        self.size = self.limit
        self.session = session or f"pid{os.getpid()}"
        self.owners = owners
        self.directory.mkdir(parents=True, exist_ok=True)
        name = f"leases-{device}.json" if device else LEDGER
        self._lock = FileLock(str(directory / f"{name}.lock"))
        self._path = directory / name

    def _read(self) -> tuple[list[Lease], list[Waiter]]:
        """Live leases and live waiters (entries of dead processes are dropped)."""
        try:
            data = json.loads(self._path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return [], []
        leases = [Lease(**entry) for entry in data["leases"]]
        waiters = [Waiter(**entry) for entry in data.get("waiting", [])]
        return [x for x in leases if alive(x.pid)], [w for w in waiters if alive(w.pid)]

    def _write(self, leases: list[Lease], waiters: list[Waiter]) -> None:
        data = {
            "leases": [dataclasses.asdict(x) for x in leases],
            "waiting": [dataclasses.asdict(w) for w in waiters],
        }
        write_atomic(self._path, json.dumps(data))

    def largest_block(self) -> int:
        """The most cores one lease can take from this slice (contiguous in host numbering)."""
        return max((n for n in (1, 2, 4, 8, 16, 32, 64) if n <= self.limit and self._blocks(n)), default=0)

    def leases(self) -> list[Lease]:
        """Current leases of live holders."""
        with self._lock:
            return self._read()[0]

    def waiting(self) -> list[Waiter]:
        """Requests of live processes still waiting for cores, first in line first."""
        with self._lock:
            return sorted(self._read()[1], key=_order)

    def _blocks(self, count: int) -> list[int]:
        """Starts of contiguous runs of ``count`` slice cores: aligned to ``count`` in host numbering
        where the slice allows (a multi-core lease then spans as few chips as possible), else any."""
        mine = set(self.cores)
        runs = [c for c in self.cores if all(c + i in mine for i in range(count))]
        aligned = [c for c in runs if c % count == 0]
        return aligned or runs

    def _place(self, busy: set[int], count: int) -> int | None:
        for first in self._blocks(count):  # first fit
            if busy.isdisjoint(range(first, first + count)):
                return first
        return None

    def _busy(self, leases: list[Lease]) -> set[int]:
        """Cores no request of this session may take: leased by anyone, or owned outside the ledger."""
        busy = {core for lease in leases for core in lease.cores}
        if self.owners is not None:
            ours = {lease.pid for lease in leases}
            # A core is free of strangers only if none of its owners is one: a run of ours sharing a chip
            # with a foreign process does not make the foreign process's cores ours.
            busy |= {core for core, pids in self.owners().items() if not all(_descends_from(pid, ours) for pid in pids)}
        return busy

    def _grant(self, leases: list[Lease], waiters: list[Waiter], key: str) -> int | None:
        """Where request ``key`` may start now, honouring every request of this session ahead of it
        and this session's cap; None to wait."""
        busy = self._busy(leases)
        budget = self.limit - sum(lease.count for lease in leases if lease.session == self.session)
        set_aside: set[int] = set()
        for waiter in sorted((w for w in waiters if w.session == self.session), key=_order):
            first = self._place(busy | set_aside, waiter.count) if waiter.count <= budget else None
            if waiter.key == key:
                return first
            if first is None:
                # It waits for the aligned block closest to free: keep that block draining.
                blocks = self._blocks(waiter.count)
                if not blocks:
                    continue
                first = min(blocks, key=lambda f: (len(busy & set(range(f, f + waiter.count))), f))
            block = set(range(first, first + waiter.count))
            # Its cores count against the cap once: busy ones are already held, shared ones reserved.
            budget -= len(block - busy - set_aside)
            set_aside |= block
        raise KeyError(key)

    def try_acquire(
        self, count: int, holder: str = "", pid: int | None = None, priority: float = 0.0, ticket: str | None = None
    ) -> Lease | None:
        """Take ``count`` contiguous cores now, or return None and keep the request queued.

        ``ticket`` identifies a request across attempts (its place in line); a call without
        one asks once and leaves nothing queued.
        """
        self._check_size(count)
        me = os.getpid() if pid is None else pid
        with self._lock:
            leases, waiters = self._read()
            key = ticket or uuid.uuid4().hex
            if not any(w.key == key for w in waiters):
                waiters.append(Waiter(key, count, me, priority, time.time(), self.session))
            first = self._grant(leases, waiters, key)
            if first is None:
                if ticket is not None:  # stay in line
                    self._write(leases, waiters)
                return None
            lease = Lease(first, count, me, holder, uuid.uuid4().hex, time.time(), self.session)
            self._write([*leases, lease], [w for w in waiters if w.key != key])
            return lease

    def acquire(
        self, count: int, holder: str = "", poll: float = 0.2, timeout: float | None = None, priority: float = 0.0
    ) -> Lease:
        """Block until ``count`` contiguous cores are granted in priority order, then take them.

        The request joins the queue first and is considered from the next poll on, never on the
        call that queues it: requests that arrive together (the first items of a parallel sweep
        reach the ledger within milliseconds of each other) are then granted in priority order,
        not in the order they happened to arrive, which would let small items take the cores a
        larger one behind them needs (benchmarks/scale.py measures the difference). A lease
        costs one poll more than it would on an idle pool."""
        deadline = None if timeout is None else time.monotonic() + timeout
        ticket = uuid.uuid4().hex
        try:
            self._join(count, priority, ticket)
            while True:
                time.sleep(poll)
                lease = self.try_acquire(count, holder, priority=priority, ticket=ticket)
                if lease is not None:
                    return lease
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"no {count} contiguous free cores within {timeout}s")
        except BaseException:
            self._leave(ticket)  # interrupted or timed out: do not hold the line for others
            raise

    def _check_size(self, count: int) -> None:
        if count > self.limit or not self._blocks(count):
            raise LeaseTooLarge(
                f"{count} cores asked for, the pool has {self.limit} (cores {_span(self.cores)} of the host)"
            )

    def _join(self, count: int, priority: float, ticket: str) -> None:
        """Queue request ``ticket`` without granting it."""
        self._check_size(count)
        with self._lock:
            leases, waiters = self._read()
            waiters.append(Waiter(ticket, count, os.getpid(), priority, time.time(), self.session))
            self._write(leases, waiters)

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


def _span(cores: Sequence[int]) -> str:
    return (
        f"{cores[0]}-{cores[-1]}"
        if cores and list(cores) == list(range(cores[0], cores[-1] + 1))
        else ",".join(map(str, cores))
    )


def _parent(pid: int) -> int | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1])


def _descends_from(pid: int, ancestors: set[int]) -> bool:
    """Whether ``pid`` is one of ``ancestors`` or a descendant of one (a lease holder's run.py and
    its ranks own the cores the holder leased)."""
    seen: set[int] = set()
    current: int | None = pid
    while current and current not in seen:
        if current in ancestors:
            return True
        seen.add(current)
        current = _parent(current)
    return False


def core_owners(data: object) -> dict[int, tuple[int, ...]]:
    """``{core: every owning pid}`` from ``neuron-ls`` JSON, in the listing's order: each device lists the
    processes using it, and every core of a device that any process uses counts as owned by each of them
    (the listing names processes per device, not per core: the conservative reading). Several processes
    on one chip are all kept: the ledger must not lease a core because the last one listed is ours.
    [infer: the JSON layout is read from the Neuron docs; ``neuron-support doctor`` checks it on a trn2
    host.]"""
    owned: dict[int, tuple[int, ...]] = {}
    devices = data if isinstance(data, list) else data.get("neuron_devices", []) if isinstance(data, dict) else []
    for index, device in enumerate(devices):
        if not isinstance(device, dict):
            continue
        count = int(device.get("nc_count") or device.get("neuroncore_count") or 0)
        ids = device.get("neuroncore_ids")
        first = int(device.get("neuron_device", index)) * count
        cores = [int(i) for i in ids] if isinstance(ids, list) else list(range(first, first + count))
        for process in device.get("neuron_processes") or []:
            pid = process.get("pid") if isinstance(process, dict) else None
            if isinstance(pid, int):
                for core in cores:
                    if pid not in owned.get(core, ()):
                        owned[core] = (*owned.get(core, ()), pid)
    return owned


def neuron_owners(command: Sequence[str] = ("neuron-ls", "-j"), ttl: float = 2.0) -> Owners:
    """An :data:`Owners` that asks ``neuron-ls`` (at most every ``ttl`` seconds); nothing is owned
    where the tool is missing or says nothing readable."""
    cached: dict[str, tuple[float, Mapping[int, Collection[int]]]] = {}

    def owners() -> Mapping[int, Collection[int]]:
        now = time.monotonic()
        if "last" in cached and now - cached["last"][0] < ttl:
            return cached["last"][1]
        try:
            proc = subprocess.run(list(command), capture_output=True, text=True, timeout=30, check=False)
            found: Mapping[int, Collection[int]] = core_owners(json.loads(proc.stdout)) if proc.returncode == 0 else {}
        except (OSError, ValueError, subprocess.TimeoutExpired):
            found = {}
        cached["last"] = (now, found)
        return found

    return owners
