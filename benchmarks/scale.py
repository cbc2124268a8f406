"""Scheduling proven at scale, by simulation: the real core ledger and the real xdist scheduler.

The Selected catalog (``models.yaml``) is planned offline by the real planner (``ModelShape.from_config``
and ``plan_cores``, what ``checks.plan.plan_model`` runs once ``inspect_model`` has read a model's
config and parameter count) from the configs in ``tests/fixtures/configs/``, for trn2 (24 GiB per
logical core, 25% headroom, at most 16 cores). Excluded entries, entries the planner skips and
entries without a config fixture are left out (and listed). Each remaining entry is one stand-in
item per copy of the catalog (``--copies``, default one catalog per 16 cores of the pool, so the
work per core is the same in every case), ordered as ``session.items.order_items`` orders a sweep:
largest cost first, cost = cores x expected seconds.

Cost model: an item holds its cores for ``checks.plan.prior_seconds(plan)`` = 60 s + 25 s per GiB of
weights, the planner's prior for a model never run before (``--jitter S`` multiplies each hold
by a seeded log-normal factor exp(N(0, S)) while the order and the ledger priority keep the prior,
as a sweep's real durations differ from its estimates). An item asks for its cores as soon as its
worker starts it (``--spread S``: after a seeded setup of up to S simulated seconds), so the first
items of a sweep ask at the same moment.

Workers stand in for xdist workers (one thread each): the real ``CostOrderScheduling`` deals them
item indices through xdist's ``Scheduling`` protocol as ``DSession`` does (``add_node``,
``add_node_collection``, ``schedule``, then ``mark_test_complete`` as each item ends, and
``remove_node`` when a worker finishes); a worker runs an item once it knows the next one or that
there is none, as xdist's worker loop does. Each item takes its cores as the ``neuron_cores``
fixture does, ``pool.acquire(cores, holder=<item>, priority=<cost>)`` on its worker's own
``CorePool`` (every worker's pool has the same session id, as xdist workers of one session have;
the ledger keys each request and lease by its own ticket and key, and uses the pid only to drop
dead holders, so threads sharing a pid are faithful), holds them while it sleeps, and releases them.
No item uses the CPU while it holds its cores, so CPU contention cannot pass for a scheduling loss.

Two clocks:

* ``--clock virtual`` (default): simulated time. One thread runs at a time (the next is drawn
  at random, seeded, among those ready, so concurrent requests reach the ledger in an arbitrary
  order, as worker processes do); when none can run, time jumps to the next wake-up. ``acquire``
  runs as written, its ``time`` replaced by the simulated clock; its polls (every ``--poll``
  simulated seconds, default 0.2, the fixture's) are skipped while the ledger file is byte for
  byte what the waiting thread last read, when a poll could only fail again and rewrite the same
  file. Deterministic for a given ``--seed``; the ledger's own run time does not count.
* ``--clock real``: wall-clock sleeps scaled by ``--ms-per-second`` (real milliseconds per
  simulated second) and real polls; the ledger's real run time (file lock, JSON, fsync) counts
  too, magnified by the scale, so it measures the ledger's overhead as much as the schedule.

Prints per case: utilisation = busy core-seconds / (pool x makespan) and makespan / lower bound,
lower bound = max(busy core-seconds / pool, longest item); also the bound that counts the workers
(each holds one item at a time: total item-seconds / workers). A core is busy while a lease holds
it. Targets at 64 cores: utilisation >= 0.95 and makespan / lower bound <= 1.05.

    python benchmarks/scale.py [--quick] [--pools 16,64] [--workers 8,16,32,64] [--copies N]
                               [--clock virtual|real] [--ms-per-second 5] [--poll 0.2]
                               [--jitter 0.0] [--spread 0.0] [--seed 0] [--timeline]
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import random
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from unittest import mock

from pytest_neuron_support.catalog.load import load_catalog
from pytest_neuron_support.checks.plan import prior_seconds
from pytest_neuron_support.devices.table import TRN2_LOGICAL_CORE_BYTES
from pytest_neuron_support.planning.planner import (
    DEFAULT_HEADROOM,
    DEFAULT_MAX_CORES,
    GIB,
    ModelShape,
    Plan,
    plan_cores,
)
from pytest_neuron_support.run import cores as cores_module
from pytest_neuron_support.run.cores import CorePool
from pytest_neuron_support.session.scheduling import CostOrderScheduling

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "tests" / "fixtures" / "configs"
POOLS = (16, 64)
WORKERS = (8, 16, 32, 64)
UTILISATION_TARGET = 0.95
RATIO_TARGET = 1.05
#: The neuron_cores fixture's poll (CorePool.acquire's default), in seconds.
FIXTURE_POLL = 0.2
_SHUTDOWN = -1  # xdist's Marker.SHUTDOWN in a worker's queue


# --- the workload -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedModel:
    """A catalog entry the planner placed: its plan and the prior seconds it is expected to take."""

    id: str
    plan: Plan

    @property
    def seconds(self) -> float:
        return prior_seconds(self.plan)

    @property
    def cost(self) -> float:
        return self.plan.cores * self.seconds


@dataclass(frozen=True)
class Item:
    """A stand-in test item: ``cores`` cores held for ``hold`` simulated seconds; ``cost`` (cores x
    expected seconds) orders the sweep and is its priority in the ledger's queue."""

    name: str
    cores: int
    hold: float
    cost: float


def plan_catalog(
    models_file: Path = REPO / "models.yaml", configs: Path = CONFIGS
) -> tuple[list[PlannedModel], list[str]]:
    """The catalog's runnable entries, planned for trn2 from the config fixtures, and a line for each
    entry left out (excluded, skipped by the planner, or without a config fixture)."""
    planned: list[PlannedModel] = []
    left_out: list[str] = []
    for spec in load_catalog(models_file).models:
        if spec.exclude is not None:
            left_out.append(f"{spec.id}: excluded ({spec.exclude.reason})")
            continue
        fixture = configs / f"{spec.id.replace('/', '_')}.json"
        if not fixture.is_file():
            left_out.append(f"{spec.id}: no config fixture in {configs.relative_to(REPO)}")
            continue
        data = json.loads(fixture.read_text(encoding="utf-8"))
        shape = ModelShape.from_config(data["config"], sum(data["parameters"].values()), "hub api")
        plan = plan_cores(
            shape,
            dtype=spec.dtype,
            core_bytes=TRN2_LOGICAL_CORE_BYTES,
            headroom=DEFAULT_HEADROOM,
            max_cores=DEFAULT_MAX_CORES,
            override=spec.cores,
        )
        if plan.skip is not None:
            left_out.append(f"{spec.id}: skipped by the planner ({plan.skip})")
            continue
        planned.append(PlannedModel(spec.id, plan))
    return planned, left_out


def workload(models: Sequence[PlannedModel], copies: int, jitter: float = 0.0, seed: int = 0) -> list[Item]:
    """``copies`` of every model, in collection order (copy by copy), then ordered as
    ``session.items.order_items`` does: ``sorted(..., key=cost, reverse=True)`` (stable: ties keep
    collection order)."""
    rng = random.Random(seed)
    items = [
        Item(
            f"models.yaml::test_model[{model.id}]#{copy}",
            model.plan.cores,
            model.seconds * (math.exp(rng.gauss(0.0, jitter)) if jitter else 1.0),
            model.cost,
        )
        for copy in range(copies)
        for model in models
    ]
    return sorted(items, key=lambda item: item.cost, reverse=True)


# --- clocks ---------------------------------------------------------------------------------------


class Mailbox(Protocol):
    def put(self, value: Any) -> None: ...

    def get(self) -> Any: ...


class Clock(Protocol):
    """What the simulation needs of time: simulated seconds, tasks, sleeps and mailboxes."""

    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...

    def mailbox(self) -> Mailbox: ...

    def spawn(self, name: str, body: Callable[[], None]) -> None: ...

    def run(self) -> None: ...

    def pool(self, directory: Path, size: int, session: str) -> CorePool: ...

    def poll(self, seconds: float) -> float:
        """The ``poll`` to pass ``acquire`` for a poll of ``seconds`` simulated seconds."""
        ...

    @contextmanager
    def ledger_time(self) -> Iterator[None]:
        """While the simulation runs: the time the ledger module sees."""
        yield


class RealClock:
    """Wall-clock time, scaled: ``ms_per_second`` real milliseconds per simulated second."""

    def __init__(self, ms_per_second: float) -> None:
        self.scale = ms_per_second / 1000.0
        self._start = time.monotonic()
        self._threads: list[threading.Thread] = []
        self._errors: list[BaseException] = []

    def now(self) -> float:
        return (time.monotonic() - self._start) / self.scale

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds * self.scale)

    def mailbox(self) -> Mailbox:
        import queue

        return queue.SimpleQueue()

    def spawn(self, name: str, body: Callable[[], None]) -> None:
        def run() -> None:
            try:
                body()
            except BaseException as exc:  # reported by run()
                self._errors.append(exc)

        self._threads.append(threading.Thread(target=run, name=name, daemon=True))

    def run(self) -> None:
        self._start = time.monotonic()
        for thread in self._threads:
            thread.start()
        for thread in self._threads:
            thread.join()
        if self._errors:
            raise self._errors[0]

    def pool(self, directory: Path, size: int, session: str) -> CorePool:
        return CorePool(directory, size, session=session, device="neuron")

    def poll(self, seconds: float) -> float:
        return seconds * self.scale

    @contextmanager
    def ledger_time(self) -> Iterator[None]:
        yield


class _Task:
    def __init__(self, name: str) -> None:
        self.name = name
        self.turn = threading.Event()
        self.seen: bytes | None = None  # the ledger file as this task last read it


class VirtualClock:
    """Simulated time for threads, a discrete-event simulation: exactly one task runs at a time, drawn
    at random (seeded) among the ready ones; when none is ready, time jumps to the earliest wake-up.

    A task blocks only here: in :meth:`sleep`, in a mailbox's ``get``, or in the ledger's poll (the
    ledger module's ``time.sleep``, see :meth:`ledger_time`). A poll waits for its next tick
    (``since + k x poll``) at or after the first moment the ledger file differs from what the task
    last read (``_ObservedPool``); the polls in between could only fail and rewrite the same file."""

    EPOCH = 1_700_000_000.0

    def __init__(self, seed: int = 0) -> None:
        self._now = 0.0
        self._lock = threading.Lock()
        self._ready: list[_Task] = []
        self._timers: list[tuple[float, int, _Task]] = []
        self._pollers: list[tuple[float, float, _Task]] = []  # (since, period, task)
        self._seq = itertools.count()
        self._rng = random.Random(seed)
        self._local = threading.local()
        self._threads: list[threading.Thread] = []
        self._live = 0
        self._done = threading.Event()
        self._errors: list[BaseException] = []
        self.ledger: Path | None = None  # the ledger file polls watch
        self.switches = 0

    def now(self) -> float:
        return self._now

    def _me(self) -> _Task:
        task: _Task = self._local.task
        return task

    def _block(self, me: _Task) -> None:
        """Give up the turn (lock held by the caller, released here) and wait for the next one."""
        me.turn.clear()
        self._dispatch()
        self._lock.release()
        me.turn.wait()

    def sleep(self, seconds: float) -> None:
        me = self._me()
        self._lock.acquire()
        heapq.heappush(self._timers, (self._now + seconds, next(self._seq), me))
        self._block(me)

    def poll_sleep(self, seconds: float) -> None:
        me = self._me()
        self._lock.acquire()
        self._pollers.append((self._now, seconds, me))
        self._block(me)

    def saw(self, content: bytes) -> None:
        self._me().seen = content

    def mailbox(self) -> Mailbox:
        return _VirtualMailbox(self)

    def spawn(self, name: str, body: Callable[[], None]) -> None:
        task = _Task(name)

        def run() -> None:
            self._local.task = task
            task.turn.wait()
            try:
                body()
            except BaseException as exc:  # reported by run()
                self._errors.append(exc)
            finally:
                with self._lock:
                    self._live -= 1
                    if self._live == 0:
                        self._done.set()
                    else:
                        self._dispatch()

        with self._lock:
            self._ready.append(task)
            self._live += 1
        self._threads.append(threading.Thread(target=run, name=name, daemon=True))

    def run(self) -> None:
        for thread in self._threads:
            thread.start()
        with self._lock:
            self._dispatch()
        self._done.wait()
        if self._errors:  # a deadlocked run leaves its (daemon) threads blocked
            raise self._errors[0]
        for thread in self._threads:
            thread.join()

    def _dispatch(self) -> None:
        """Hand the turn to a ready task (lock held), advancing time while none is ready."""
        self.switches += 1
        while not self._ready:
            self._wake_pollers()
            if not self._timers:
                waiting = ", ".join(task.name for _, _, task in self._pollers) or "none"
                self._errors.append(RuntimeError(f"deadlock at t={self._now:.1f}; waiting for cores: {waiting}"))
                self._done.set()
                return
            self._now = max(self._now, self._timers[0][0])
            while self._timers and self._timers[0][0] <= self._now:
                self._ready.append(heapq.heappop(self._timers)[2])
        task = self._ready.pop(self._rng.randrange(len(self._ready)))
        task.turn.set()

    def _wake_pollers(self) -> None:
        """Schedule the next poll of every waiting task whose view of the ledger is out of date."""
        if not self._pollers:
            return
        assert self.ledger is not None
        try:
            current = self.ledger.read_bytes()
        except FileNotFoundError:
            current = b""
        parked = []
        for since, period, task in self._pollers:
            if task.seen == current:
                parked.append((since, period, task))
                continue
            ticks = max(1, math.ceil((self._now - since) / period - 1e-9))
            heapq.heappush(self._timers, (since + ticks * period, next(self._seq), task))
        self._pollers = parked

    def pool(self, directory: Path, size: int, session: str) -> CorePool:
        return _ObservedPool(directory, size, session=session, device="neuron", clock=self)

    def poll(self, seconds: float) -> float:
        return seconds

    @contextmanager
    def ledger_time(self) -> Iterator[None]:
        with (
            mock.patch.object(cores_module, "time", _LedgerTime(self)),
            mock.patch.object(cores_module, "uuid", _SeededUuid(self._rng.getrandbits(64))),
        ):
            yield


class _VirtualMailbox:
    """A queue with one reader, whose ``get`` blocks in simulated time."""

    def __init__(self, clock: VirtualClock) -> None:
        self._clock = clock
        self._items: deque[Any] = deque()
        self._reader: _Task | None = None

    def put(self, value: Any) -> None:
        with self._clock._lock:
            self._items.append(value)
            if self._reader is not None:
                self._clock._ready.append(self._reader)
                self._reader = None

    def get(self) -> Any:
        clock = self._clock
        me = clock._me()
        clock._lock.acquire()
        if not self._items:
            self._reader = me
            clock._block(me)
            clock._lock.acquire()
        value = self._items.popleft()
        clock._lock.release()
        return value


class _LedgerTime:
    """The ``time`` module as ``cores.py`` sees it under the virtual clock."""

    def __init__(self, clock: VirtualClock) -> None:
        self._clock = clock

    def time(self) -> float:
        return VirtualClock.EPOCH + self._clock.now()

    def monotonic(self) -> float:
        return self._clock.now()

    def sleep(self, seconds: float) -> None:
        self._clock.poll_sleep(seconds)


class _SeededUuid:
    """The ``uuid`` module as ``cores.py`` sees it under the virtual clock: seeded, so a run's keys
    (the last tie-break of the ledger's queue) and so the run itself repeat for a given seed."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def uuid4(self) -> uuid.UUID:
        return uuid.UUID(int=self._rng.getrandbits(128), version=4)


class _ObservedPool(CorePool):
    """A CorePool that tells the virtual clock what its task read of the ledger (under the ledger's
    lock, as it read it); it changes nothing the ledger does."""

    def __init__(self, *args: Any, clock: VirtualClock, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._clock = clock
        clock.ledger = self._path

    def _read(self) -> tuple[list[cores_module.Lease], list[cores_module.Waiter]]:
        result = super()._read()
        try:
            self._clock.saw(self._path.read_bytes())
        except FileNotFoundError:
            self._clock.saw(b"")
        return result


# --- the simulation ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Span:
    """One item's run, in simulated seconds from the start: asked for its cores at ``asked``, held
    cores ``first .. first + count - 1`` from ``start`` to ``end``, on ``worker``."""

    item: int
    worker: str
    first: int
    count: int
    asked: float
    start: float
    end: float

    @property
    def held(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Outcome:
    """A case's recorded timeline and what follows from it."""

    pool: int
    workers: int
    items: tuple[Item, ...]
    spans: tuple[Span, ...]

    @property
    def busy(self) -> float:
        """Busy core-seconds: cores x seconds held, over every item."""
        return sum(span.count * span.held for span in self.spans)

    @property
    def makespan(self) -> float:
        return max(span.end for span in self.spans) - min(span.start for span in self.spans)

    @property
    def longest(self) -> float:
        return max(span.held for span in self.spans)

    @property
    def lower_bound(self) -> float:
        """No schedule of these holds on this pool ends sooner: max(busy / pool, longest item)."""
        return max(self.busy / self.pool, self.longest)

    @property
    def worker_bound(self) -> float:
        """The lower bound once the workers count too: each holds one item at a time."""
        return max(self.lower_bound, sum(span.held for span in self.spans) / self.workers)

    @property
    def utilisation(self) -> float:
        return self.busy / (self.pool * self.makespan)

    @property
    def ratio(self) -> float:
        return self.makespan / self.lower_bound


def double_booked(spans: Sequence[Span]) -> list[tuple[int, int, int]]:
    """(core, item, item) for every two spans that hold one core at the same time (half-open
    intervals: a core released at t may be granted at t)."""
    clashes = []
    by_core: dict[int, list[Span]] = {}
    for span in spans:
        for core in range(span.first, span.first + span.count):
            by_core.setdefault(core, []).append(span)
    for core, held in sorted(by_core.items()):
        held.sort(key=lambda span: span.start)
        for before, after in itertools.pairwise(held):
            if after.start < before.end:
                clashes.append((core, before.item, after.item))
    return clashes


@dataclass(eq=False)
class _Node:
    """What CostOrderScheduling uses of xdist's WorkerController: gateway.id, send_runtest_some,
    shutdown, shutting_down. The indices go to the worker's queue, as xdist's channel delivers them."""

    name: str
    torun: Mailbox
    shutting_down: bool = False

    @property
    def gateway(self) -> Any:
        return _Gateway(self.name)

    def send_runtest_some(self, indices: Sequence[int]) -> None:
        assert not self.shutting_down, f"{self.name}: items sent after shutdown"
        for index in indices:
            self.torun.put(index)

    def shutdown(self) -> None:
        if not self.shutting_down:
            self.shutting_down = True
            self.torun.put(_SHUTDOWN)


@dataclass(frozen=True)
class _Gateway:
    id: str


class _Config:
    """The config attributes the scheduler uses (a collection-difference report needs the hook)."""

    class hook:  # stands in for pytest's config.hook
        @staticmethod
        def pytest_collectreport(report: Any) -> None:
            raise AssertionError(f"workers collected different items: {report.longrepr}")


def simulate(
    items: Sequence[Item],
    pool: int,
    workers: int,
    *,
    clock: Clock | None = None,
    poll: float = FIXTURE_POLL,
    spread: float = 0.0,
    seed: int = 0,
    ledger_dir: Path | None = None,
) -> Outcome:
    """Run ``items`` (in sweep order) on ``workers`` stand-in xdist workers over a ``pool``-core ledger
    and return the timeline. ``poll`` is the ledger poll in simulated seconds; ``spread`` the most
    simulated seconds an item's setup takes before it asks for cores (drawn uniformly, seeded)."""
    clock = clock or VirtualClock()
    names = [item.name for item in items]
    session = f"scale-{uuid.uuid4().hex[:8]}"
    events = clock.mailbox()
    nodes = [_Node(f"gw{i}", clock.mailbox()) for i in range(workers)]
    spans: list[Span] = []
    logged: list[str] = []
    with tempfile.TemporaryDirectory(prefix="neuron-scale-") as tmp:
        directory = ledger_dir or Path(tmp)

        def controller() -> None:  # what DSession does with the scheduler
            config: Any = _Config()
            sched = CostOrderScheduling(config, lambda *parts: logged.append(" ".join(map(str, parts))), workers)
            for node in nodes:
                sched.add_node(node)
            for node in nodes:
                sched.add_node_collection(node, names)
            sched.schedule()
            running = len(nodes)
            while running:
                kind, node, index = events.get()
                if kind == "complete":
                    sched.mark_test_complete(node, index)
                else:
                    assert sched.remove_node(node) is None, f"{node.name} went down holding an item"
                    running -= 1
            assert sched.tests_finished, "workers finished with items left"

        def worker(node: _Node) -> Callable[[], None]:
            def loop() -> None:  # xdist's worker: run an item once the next one (or shutdown) is known
                ledger = clock.pool(directory, pool, session)
                setup = random.Random(f"{seed}/{node.name}")
                current = node.torun.get()
                while current != _SHUTDOWN:
                    following = node.torun.get()
                    item = items[current]
                    if spread:
                        clock.sleep(setup.uniform(0.0, spread))
                    asked = clock.now()
                    lease = ledger.acquire(item.cores, holder=item.name, poll=clock.poll(poll), priority=item.cost)
                    start = clock.now()
                    clock.sleep(item.hold)
                    end = clock.now()
                    ledger.release(lease)
                    spans.append(Span(current, node.name, lease.first, lease.count, asked, start, end))
                    events.put(("complete", node, current))
                    current = following
                events.put(("finished", node, None))

            return loop

        clock.spawn("controller", controller)
        for node in nodes:
            clock.spawn(node.name, worker(node))
        with clock.ledger_time():
            clock.run()
    if logged:
        raise AssertionError("; ".join(logged))
    return Outcome(pool, workers, tuple(items), tuple(sorted(spans, key=lambda span: span.item)))


# --- the report -------------------------------------------------------------------------------------


def _columns() -> str:
    return (
        f"{'pool':>4} {'workers':>7} {'copies':>6} {'items':>5} {'makespan':>9} {'busy core-s':>12} "
        f"{'lower bd':>9} {'util':>6} {'ratio':>6} {'+workers bd':>11} {'ratio':>6}  targets"
    )


def _row(outcome: Outcome, copies: int) -> str:
    at_target = outcome.pool >= 64
    met = outcome.utilisation >= UTILISATION_TARGET and outcome.ratio <= RATIO_TARGET
    verdict = ("met" if met else "MISSED") if at_target else "-"
    return (
        f"{outcome.pool:>4} {outcome.workers:>7} {copies:>6} {len(outcome.items):>5} {outcome.makespan:>9.0f} "
        f"{outcome.busy:>12.0f} {outcome.lower_bound:>9.0f} {outcome.utilisation:>6.3f} {outcome.ratio:>6.3f} "
        f"{outcome.worker_bound:>11.0f} {outcome.makespan / outcome.worker_bound:>6.3f}  {verdict}"
    )


def _label(item: Item) -> str:
    """``<model id>#<copy>`` of an item named ``models.yaml::test_model[<model id>]#<copy>``."""
    return item.name.removeprefix("models.yaml::test_model[").replace("]#", "#")


def timeline(outcome: Outcome, limit: int = 40) -> list[str]:
    """The first ``limit`` grants, in grant order: who asked when, and what it got."""
    lines = []
    for span in sorted(outcome.spans, key=lambda span: (span.start, span.item))[:limit]:
        item = outcome.items[span.item]
        cores = f"{span.first}-{span.first + span.count - 1}"
        lines.append(
            f"    #{span.item:<3} {_label(item):<52} {span.worker:>5} cores {cores:<6} "
            f"asked {span.asked:7.1f} start {span.start:7.1f} end {span.end:7.1f}"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: pool 16, 8 and 16 workers, one catalog copy")
    parser.add_argument("--pools", default=",".join(map(str, POOLS)), help="pool sizes (cores)")
    parser.add_argument("--workers", default=",".join(map(str, WORKERS)), help="worker counts")
    parser.add_argument("--copies", type=int, default=None, help="catalog copies (default: pool / 16, at least 1)")
    parser.add_argument("--clock", choices=("virtual", "real"), default="virtual")
    parser.add_argument("--ms-per-second", type=float, default=5.0, help="real ms per simulated second (--clock real)")
    parser.add_argument("--poll", type=float, default=FIXTURE_POLL, help="ledger poll, simulated seconds")
    parser.add_argument("--jitter", type=float, default=0.0, help="sigma of the log-normal factor on each hold")
    parser.add_argument(
        "--spread", type=float, default=0.0, help="most simulated seconds an item's setup takes before it asks"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeline", action="store_true", help="print each case's first grants")
    args = parser.parse_args(argv)
    pools = [16] if args.quick else [int(p) for p in args.pools.split(",")]
    worker_counts = [8, 16] if args.quick else [int(w) for w in args.workers.split(",")]

    models, left_out = plan_catalog()
    print(f"catalog: {len(models)} runnable entries planned for trn2 ({TRN2_LOGICAL_CORE_BYTES // GIB} GiB per core)")
    print("cost model: hold = checks.plan.prior_seconds(plan) = 60 s + 25 s x GiB of weights; cost = cores x hold")
    if args.jitter:
        print(f"  holds jittered by exp(N(0, {args.jitter})) (seed {args.seed}); order and priority keep the prior")
    print(f"  {'model':<48} {'cores':>5} {'GiB':>6} {'hold s':>7} {'cost':>7}")
    for model in sorted(models, key=lambda m: m.cost, reverse=True):
        gib = model.plan.weight_bytes / GIB
        print(f"  {model.id:<48} {model.plan.cores:>5} {gib:>6.1f} {model.seconds:>7.0f} {model.cost:>7.0f}")
    print(f"left out ({len(left_out)}):")
    for line in left_out:
        print(f"  {line}")
    clock_text = (
        "virtual (simulated seconds; the ledger's own run time does not count)"
        if args.clock == "virtual"
        else f"real, {args.ms_per_second:g} ms per simulated second"
    )
    spread = f"; item setup 0-{args.spread:g} s before it asks" if args.spread else ""
    print(f"clock: {clock_text}; ledger poll {args.poll:g} simulated s{spread}; seed {args.seed}")
    print("times below in simulated seconds")
    print(_columns())
    results: list[Outcome] = []
    for pool in pools:
        copies = args.copies or (1 if args.quick else max(1, pool // 16))
        items = workload(models, copies, args.jitter, args.seed)
        for workers in worker_counts:
            clock: Clock = VirtualClock(args.seed) if args.clock == "virtual" else RealClock(args.ms_per_second)
            began = time.monotonic()
            outcome = simulate(items, pool, workers, clock=clock, poll=args.poll, spread=args.spread, seed=args.seed)
            wall = time.monotonic() - began
            clashes = double_booked(outcome.spans)
            ran = sorted(span.item for span in outcome.spans)
            assert ran == list(range(len(items))), "an item did not run exactly once"
            assert not clashes, f"double-booked cores: {clashes[:5]}"
            print(f"{_row(outcome, copies)}  ({wall:.0f} s wall)", flush=True)
            if args.timeline:
                print("\n".join(timeline(outcome)))
            results.append(outcome)
    print("every item ran exactly once; no core double-booked in any case")
    at_target = [o for o in results if o.pool >= 64]
    if at_target:
        best = max(at_target, key=lambda o: (o.utilisation, -o.ratio))
        met = best.utilisation >= UTILISATION_TARGET and best.ratio <= RATIO_TARGET
        print(
            f"targets at 64 cores (utilisation >= {UTILISATION_TARGET}, ratio <= {RATIO_TARGET}): "
            f"best {best.utilisation:.3f} and {best.ratio:.3f} with {best.workers} workers: "
            f"{'met' if met else 'MISSED'}"
        )


if __name__ == "__main__":
    main()
