"""The cost-order scheduler, driven through xdist's Scheduling protocol as DSession drives it.

The workers are stand-ins that record what the scheduler sends them (a real xdist worker is a
process; every pytester run with -n 2 in this suite exercises the scheduler with real ones)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from pytest_neuron_support.session.scheduling import CostOrderScheduling, collection_diff


@dataclass
class _Gateway:
    id: str


@dataclass(eq=False)
class Worker:
    """What the scheduler may use of xdist's WorkerController: gateway.id, send_runtest_some,
    shutdown and shutting_down."""

    name: str
    sent: list[int] = field(default_factory=list)
    shutting_down: bool = False

    @property
    def gateway(self) -> _Gateway:
        return _Gateway(self.name)

    def send_runtest_some(self, indices: list[int]) -> None:
        assert not self.shutting_down, f"{self.name}: items sent after shutdown"
        self.sent.extend(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


class _Hook:
    def __init__(self) -> None:
        self.reports: list[pytest.CollectReport] = []

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self.reports.append(report)


class _Config:
    def __init__(self) -> None:
        self.hook = _Hook()


ITEMS = [f"models.yaml::m{i}" for i in range(7)]  # already in cost order, largest first


def _scheduler(workers: list[Worker], collections: list[list[str]] | None = None) -> tuple[Any, list[str]]:
    logged: list[str] = []
    config = _Config()
    sched = CostOrderScheduling(config, lambda *parts: logged.append(" ".join(map(str, parts))), len(workers))
    for worker in workers:
        sched.add_node(worker)
    assert not sched.collection_is_completed
    for worker, collection in zip(workers, collections or [ITEMS] * len(workers), strict=True):
        sched.add_node_collection(worker, collection)
    assert sched.collection_is_completed
    return sched, logged


def test_deals_round_robin_in_cost_order_then_one_at_a_time() -> None:
    a, b = Worker("gw0"), Worker("gw1")
    sched, _ = _scheduler([a, b])
    sched.schedule()
    # The two largest items start first, on different workers; each worker holds two.
    assert (a.sent, b.sent) == ([0, 2], [1, 3])
    sched.mark_test_complete(a, 0)
    assert a.sent == [0, 2, 4] and b.sent == [1, 3]  # one item per finished item, not a chunk
    sched.mark_test_complete(b, 1)
    sched.mark_test_complete(b, 3)
    assert b.sent == [1, 3, 5, 6]
    assert sched.has_pending and not sched.tests_finished
    for worker, index in [(a, 2), (a, 4), (b, 5)]:
        sched.mark_test_complete(worker, index)
    assert a.shutting_down and b.shutting_down  # nothing left to deal: both told to finish
    sched.mark_test_complete(b, 6)
    assert sorted(a.sent + b.sent) == list(range(len(ITEMS))) and not sched.has_pending and sched.tests_finished


def test_a_crashed_worker_returns_its_running_item_and_requeues_the_rest_first() -> None:
    a, b = Worker("gw0"), Worker("gw1")
    sched, _ = _scheduler([a, b])
    sched.schedule()
    assert sched.remove_node(a) == ITEMS[0]  # what gw0 was running when it died
    # Its queued item (2) goes back to the front, ahead of 4..6, and the live worker is topped up.
    assert sched.pending == [2, 4, 5, 6]
    sched.mark_test_complete(b, 1)
    assert b.sent == [1, 3, 2]
    assert sched.remove_node(b) == ITEMS[3]
    assert Worker("gw2") not in sched.nodes


def test_a_crashed_item_asked_to_rerun_goes_first() -> None:
    a, b = Worker("gw0"), Worker("gw1")
    sched, _ = _scheduler([a, b])
    sched.schedule()
    crashed = sched.remove_node(a)
    assert crashed is not None
    replacement = Worker("gw2")
    sched.add_node(replacement)
    sched.add_node_collection(replacement, ITEMS)
    sched.mark_test_pending(crashed)
    assert replacement.sent[0] == 0


def test_workers_that_collected_different_lists_abort_the_run_with_the_difference() -> None:
    a, b = Worker("gw0"), Worker("gw1")
    other = [ITEMS[1], ITEMS[0], *ITEMS[2:]]  # the same models in another order (another plan)
    sched, logged = _scheduler([a, b], [ITEMS, other])
    sched.schedule()
    assert a.sent == [] and b.sent == []
    [report] = sched.config.hook.reports
    assert report.outcome == "failed" and "+models.yaml::m1\n models.yaml::m0\n-models.yaml::m1" in str(report.longrepr)
    assert "gw0" in str(report.longrepr) and "gw1" in str(report.longrepr)
    assert any("Different tests collected" in line for line in logged)


def test_a_replacement_worker_with_another_collection_is_not_used() -> None:
    a, b = Worker("gw0"), Worker("gw1")
    sched, logged = _scheduler([a, b])
    sched.schedule()
    sched.remove_node(a)
    late = Worker("gw2")
    sched.add_node(late)
    sched.add_node_collection(late, ITEMS[:-1])
    assert late not in sched.node2collection and any("gw2" in line for line in logged)


def test_items_handed_back_unrun_are_dealt_again_first() -> None:
    a, b = Worker("gw0"), Worker("gw1")
    sched, _ = _scheduler([a, b])
    sched.schedule()
    sched.remove_pending_tests_from_node(a, [2])
    assert sched.node2pending[a] == [0] and sched.pending[0] == 2


def test_an_empty_collection_sends_nothing() -> None:
    a = Worker("gw0")
    sched, _ = _scheduler([a], [[]])
    sched.schedule()
    assert a.sent == [] and sched.tests_finished


def test_collection_diff() -> None:
    assert collection_diff(ITEMS, list(ITEMS), "gw0", "gw1") is None
    message = collection_diff(ITEMS, ITEMS[:-1], "gw0", "gw1")
    assert message is not None and f"-{ITEMS[-1]}" in message
