"""The core ledger under real concurrent processes, including one killed mid-lease."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_neuron_support.cores import CorePool, LeaseTooLarge


def _worker(directory: str, size: int, seed: int, rounds: int, out: str) -> None:
    pool = CorePool(Path(directory), size)
    rng = random.Random(seed)
    records = []
    for _ in range(rounds):
        count = rng.choice([1, 2, 4])
        with pool.lease(count, holder=f"w{seed}") as lease:
            start = time.time()
            time.sleep(rng.uniform(0.005, 0.03))
            records.append({"first": lease.first, "count": count, "start": start, "end": time.time()})
    Path(out).write_text(json.dumps(records))


def overlaps(records: list[dict[str, float]]) -> list[tuple[int, int]]:
    bad = []
    for i, a in enumerate(records):
        for j, b in enumerate(records[:i]):
            cores_a = set(range(int(a["first"]), int(a["first"] + a["count"])))
            cores_b = set(range(int(b["first"]), int(b["first"] + b["count"])))
            if cores_a & cores_b and a["start"] < b["end"] and b["start"] < a["end"]:
                bad.append((i, j))
    return bad


def test_many_processes_over_a_small_pool_never_share_a_core(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    outs = [tmp_path / f"w{i}.json" for i in range(6)]
    procs = [ctx.Process(target=_worker, args=(str(tmp_path / "pool"), 4, i, 15, str(outs[i]))) for i in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    records = [r for out in outs for r in json.loads(out.read_text())]
    assert len(records) == 90
    assert all(r["first"] % r["count"] == 0 and r["first"] + r["count"] <= 4 for r in records)  # aligned, in pool
    assert overlaps(records) == []
    # Demand exceeded the pool: leases had to wait, so some ran concurrently on other cores.
    concurrent = sum(
        1 for a in records for b in records if a is not b and a["start"] < b["end"] and b["start"] < a["end"]
    )
    assert concurrent > 0


def test_the_overlap_check_catches_a_double_booking() -> None:
    assert overlaps([{"first": 0, "count": 2, "start": 0, "end": 2}, {"first": 1, "count": 1, "start": 1, "end": 3}])


def test_a_killed_holder_does_not_leak_its_cores(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from pytest_neuron_support.cores import CorePool\n"
            "lease = CorePool(Path(sys.argv[1]), 4).acquire(4, 'doomed'); print('held', flush=True); time.sleep(600)",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    pool = CorePool(tmp_path, 4)
    assert pool.try_acquire(1) is None  # all four are held
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    lease = pool.acquire(4, timeout=10)
    assert list(lease.cores) == [0, 1, 2, 3]


def test_contiguous_aligned_placement_and_release(tmp_path: Path) -> None:
    pool = CorePool(tmp_path, 8)
    a = pool.acquire(1)
    b = pool.acquire(2)
    c = pool.acquire(4)
    assert (a.first, b.first, c.first) == (0, 2, 4)
    assert pool.try_acquire(4) is None
    pool.release(c)
    assert pool.acquire(4).first == 4
    assert {lease.key for lease in pool.leases()} >= {a.key, b.key}


def test_more_cores_than_the_pool_is_refused_not_waited_for(tmp_path: Path) -> None:
    with pytest.raises(LeaseTooLarge, match="5 cores asked for, the pool has 4"):
        CorePool(tmp_path, 4).acquire(5)


def test_a_queued_larger_request_is_not_starved_and_smaller_ones_backfill_around_it(tmp_path: Path) -> None:
    pool = CorePool(tmp_path, 8)
    one = pool.acquire(1)  # core 0
    pool.acquire(2)  # cores 2-3
    pool.acquire(2)  # cores 4-5
    # A 4-core request waits for the aligned block closest to free: 4-7 (two busy cores; 0-3 has three).
    assert pool.try_acquire(4, priority=9.0, ticket="big") is None
    assert [w.key for w in pool.waiting()] == ["big"]
    # A lower-priority request may not take a core of that block though cores 6-7 are free,
    assert pool.try_acquire(2, priority=1.0, ticket="pair") is None
    # ... but backfills outside it: core 1.
    small = pool.try_acquire(1, priority=1.0, ticket="small")
    assert small is not None and small.first == 1
    pool.release(one)
    assert pool.try_acquire(1, priority=1.0) is not None  # core 0: still outside the block
    assert [w.key for w in pool.waiting()] == ["big", "pair"]


def test_equal_priorities_are_served_first_come_and_one_shot_tries_leave_no_queue(tmp_path: Path) -> None:
    pool = CorePool(tmp_path, 2)
    held = pool.acquire(2)
    assert pool.try_acquire(2, ticket="first") is None
    assert pool.try_acquire(1, ticket="second") is None
    assert pool.try_acquire(1) is None  # no ticket: asks once, queues nothing
    assert [w.key for w in pool.waiting()] == ["first", "second"]
    pool.release(held)
    assert pool.try_acquire(1, ticket="second") is None  # "first" is ahead and needs both cores
    assert pool.try_acquire(2, ticket="first") is not None


def test_a_killed_waiter_does_not_hold_the_line(tmp_path: Path) -> None:
    pool = CorePool(tmp_path, 4)
    held = pool.acquire(4)
    waiter = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from pytest_neuron_support.cores import CorePool\n"
            "CorePool(Path(sys.argv[1]), 4).acquire(4, 'doomed', priority=100.0)",
            str(tmp_path),
        ]
    )
    deadline = time.monotonic() + 30
    while not pool.waiting() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [w.pid for w in pool.waiting()] == [waiter.pid]
    pool.release(held)
    os.kill(waiter.pid, signal.SIGKILL)  # killed while waiting, before it got the cores
    waiter.wait()
    assert pool.acquire(1, timeout=10).first == 0
    assert pool.waiting() == []
