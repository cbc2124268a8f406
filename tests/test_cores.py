"""The core ledger under real concurrent processes, including one killed mid-lease."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pytest_neuron_support.run.cores import CorePool, LeaseTooLarge


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
            "import sys, time; from pathlib import Path; from pytest_neuron_support.run.cores import CorePool\n"
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


def test_requests_that_arrive_together_are_granted_in_priority_order_not_arrival_order(tmp_path: Path) -> None:
    # A 1-core request asks a moment before a 4-core one of higher priority, on an idle pool of 4:
    # granted on arrival it would make the larger wait for it to end (a sweep's start, where every
    # worker asks at once; benchmarks/scale.py). Queued first and considered a poll later, it waits.
    pool = CorePool(tmp_path, 4)
    granted: dict[str, tuple[float, float]] = {}

    def ask(name: str, count: int, priority: float, hold: float) -> None:
        with pool.lease(count, holder=name, priority=priority) as lease:
            start = time.monotonic()
            time.sleep(hold)
            granted[name] = (start, time.monotonic())
        assert lease.count == count

    small = threading.Thread(target=ask, args=("small", 1, 1.0, 0.05))
    large = threading.Thread(target=ask, args=("large", 4, 9.0, 0.3))
    small.start()
    time.sleep(0.05)  # well inside the first poll (0.2 s)
    large.start()
    small.join(30)
    large.join(30)
    assert granted["small"][0] >= granted["large"][1]  # the larger went first, then the smaller
    assert pool.waiting() == [] and pool.leases() == []


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
    # One session for both (the queue orders the requests of a session): a live waiter for all 4 cores
    # at priority 100 sets every core aside for itself, so only its death lets a 1-core request through.
    pool = CorePool(tmp_path, 4, session="one")
    held = pool.acquire(4)
    waiter = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from pytest_neuron_support.run.cores import CorePool\n"
            "CorePool(Path(sys.argv[1]), 4, session='one').acquire(4, 'doomed', priority=100.0)",
            str(tmp_path),
        ]
    )
    deadline = time.monotonic() + 30
    while not pool.waiting() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [w.pid for w in pool.waiting()] == [waiter.pid]
    # Killed while waiting, and reaped, before the cores are released: it cannot have got them.
    os.kill(waiter.pid, signal.SIGKILL)
    assert waiter.wait(timeout=30) == -signal.SIGKILL  # it was still waiting: it did not end on its own
    assert pool.leases() == [held]  # and it took nothing
    pool.release(held)
    assert pool.acquire(1, timeout=10).first == 0
    assert pool.waiting() == []


# --- host-wide leases: slices in host numbering, sessions sharing one ledger, cores owned outside it ---


def test_core_lists_parse_as_the_runtime_writes_them() -> None:
    from pytest_neuron_support.run.cores import parse_cores, session_cores

    assert parse_cores("3") == (3,) and parse_cores("8-11") == (8, 9, 10, 11)
    assert parse_cores("0,1, 4-5") == (0, 1, 4, 5)
    for bad in ("a", "5-3", "1-"):
        with pytest.raises(ValueError):
            parse_cores(bad)
    # The slice a parent hands a session: ours first, then the device's own variable, else all reported.
    assert session_cores(("NEURON_RT_VISIBLE_CORES",), 64, {"NEURON_RT_VISIBLE_CORES": "8-15"}) == tuple(range(8, 16))
    env = {"NEURON_SUPPORT_VISIBLE_CORES": "4-5", "NEURON_RT_VISIBLE_CORES": "8-15"}
    assert session_cores(("NEURON_RT_VISIBLE_CORES",), 64, env) == (4, 5)
    assert session_cores(("NEURON_RT_VISIBLE_CORES",), 4, {}) == (0, 1, 2, 3)
    with pytest.raises(ValueError, match="NEURON_RT_VISIBLE_CORES=x"):
        session_cores(("NEURON_RT_VISIBLE_CORES",), 4, {"NEURON_RT_VISIBLE_CORES": "x"})


def test_a_session_given_a_slice_leases_and_pins_inside_it_in_host_numbering(tmp_path: Path) -> None:
    from pytest_neuron_support.devices.table import DEVICES

    pool = CorePool(tmp_path, tuple(range(8, 16)), device="neuron")
    two = pool.acquire(2)
    four = pool.acquire(4)
    one = pool.acquire(1)
    assert (two.first, four.first, one.first) == (8, 12, 10)  # aligned in host numbering, never 0-7
    # The child's pinning names host cores: under a parent slice 8-15 a 2-core lease is 8-9, not 0-1.
    assert DEVICES["neuron"].pin_cores(two.first, two.count) == {"NEURON_RT_VISIBLE_CORES": "8-9"}
    assert DEVICES["cuda"].pin_cores(four.first, four.count) == {"CUDA_VISIBLE_DEVICES": "12,13,14,15"}
    with pytest.raises(LeaseTooLarge, match=r"the pool has 8 \(cores 8-15 of the host\)"):
        pool.acquire(16)
    assert pool.largest_block() == 8


def test_two_sessions_on_one_ledger_never_share_a_core_and_each_keeps_its_cap(tmp_path: Path) -> None:
    a = CorePool(tmp_path, 4, limit=2, session="a")
    b = CorePool(tmp_path, 4, limit=2, session="b")
    first = a.acquire(2)
    assert a.try_acquire(1) is None  # a holds its cap of 2 though cores are free
    second = b.acquire(2)
    assert set(first.cores).isdisjoint(second.cores) and {first.first, second.first} == {0, 2}
    assert b.try_acquire(1) is None
    a.release(first)
    assert b.try_acquire(1) is None  # b is at its cap; a's release does not lend b a core
    assert a.try_acquire(1) is not None


def test_cores_owned_outside_the_ledger_are_not_leased_but_our_own_runs_are_ours(tmp_path: Path) -> None:
    # pid 1 (init) holds cores 0 and 1: another runner, outside the ledger. Core 4 is held by a child
    # of this process, which holds leases: one of our own runs, not a stranger.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        pool = CorePool(tmp_path, 8, owners=lambda: {0: (1,), 1: (1,), 4: (child.pid,)})
        first = pool.acquire(2)
        assert first.first == 2  # 0-1 are taken by the stranger
        second = pool.acquire(2)
        assert second.first == 4  # our own child's core does not count against us
        assert pool.try_acquire(4) is None  # the only aligned 4-block left, 0-3, holds the stranger's cores
    finally:
        child.kill()
        child.wait()


def test_neuron_ls_listing_marks_every_core_of_a_used_device() -> None:
    from pytest_neuron_support.run.cores import core_owners

    listing = [
        {"neuron_device": 0, "nc_count": 4, "neuron_processes": [{"pid": 4242, "command": "python other.py"}]},
        {"neuron_device": 1, "nc_count": 4, "neuron_processes": []},
        {"neuron_device": 2, "nc_count": 4, "neuroncore_ids": [8, 9, 10, 11], "neuron_processes": [{"pid": 7}]},
    ]
    assert core_owners(listing) == {
        0: (4242,),
        1: (4242,),
        2: (4242,),
        3: (4242,),
        8: (7,),
        9: (7,),
        10: (7,),
        11: (7,),
    }
    assert core_owners({"neuron_devices": listing[:1]}) == {0: (4242,), 1: (4242,), 2: (4242,), 3: (4242,)}
    assert core_owners("garbage") == {}
    shared = [{"neuron_device": 0, "nc_count": 2, "neuron_processes": [{"pid": 5}, {"pid": 6}, {"pid": 5}]}]
    assert core_owners(shared) == {0: (5, 6), 1: (5, 6)}


def test_a_chip_a_stranger_shares_with_one_of_our_runs_is_not_leased(tmp_path: Path) -> None:
    # The issue: one owner was kept per core, the last listed; a chip holding a foreign process and then one
    # of our own runs read as ours alone, and the ledger leased the stranger's cores.
    from pytest_neuron_support.run.cores import neuron_owners

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        listing = [
            # Chip 0 (cores 0-1): pid 1 (init: not ours), then our own child, listed last.
            {"neuron_device": 0, "nc_count": 2, "neuron_processes": [{"pid": 1}, {"pid": child.pid}]},
            {"neuron_device": 1, "nc_count": 2, "neuron_processes": []},
            # Chip 2 (cores 4-5): our child alone.
            {"neuron_device": 2, "nc_count": 2, "neuron_processes": [{"pid": child.pid}]},
        ]
        (tmp_path / "neuron-ls.json").write_text(json.dumps(listing))
        owners = neuron_owners(("cat", str(tmp_path / "neuron-ls.json")))
        pool = CorePool(tmp_path / "ledger", 6, owners=owners)
        # The free chip first; then, holding a lease, our child's chip is ours; chip 0 is not, though our
        # child shares it.
        assert [pool.acquire(2, poll=0.01).first, pool.acquire(2, poll=0.01).first] == [2, 4]
        assert pool.try_acquire(1) is None
    finally:
        child.kill()
        child.wait()
