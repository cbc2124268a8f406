"""benchmarks/scale.py's simulation on tiny cases: the real core ledger and the real xdist scheduler,
checked from the recorded timeline by code of this test's own (not the benchmark's checks)."""

from __future__ import annotations

import importlib.util
import itertools
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCHMARK = Path(__file__).resolve().parent.parent / "benchmarks" / "scale.py"


@pytest.fixture(scope="module")
def scale() -> ModuleType:
    spec = importlib.util.spec_from_file_location("scale_benchmark", BENCHMARK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def clashes(spans: Sequence[Any]) -> list[tuple[int, int]]:
    """Pairs of items that held a common core at a common instant (intervals are half-open)."""
    found = []
    for i, a in enumerate(spans):
        for b in spans[:i]:
            cores = set(range(a.first, a.first + a.count)) & set(range(b.first, b.first + b.count))
            if cores and a.start < b.end and b.start < a.end:
                found.append((a.item, b.item))
    return found


def test_a_quick_catalog_sweep_runs_every_item_once_without_double_booking_and_its_figures_add_up(
    scale: ModuleType,
) -> None:
    models, _ = scale.plan_catalog()
    assert {m.plan.cores for m in models} == {1, 2, 4, 8} and all(m.plan.skip is None for m in models)
    items = scale.workload(models, 1)
    assert [item.cost for item in items] == sorted((item.cost for item in items), reverse=True)
    pool, workers = 16, 8

    outcome = scale.simulate(items, pool, workers, clock=scale.VirtualClock(0))
    spans = list(outcome.spans)

    assert sorted(span.item for span in spans) == list(range(len(items)))  # every item ran, exactly once
    for span in spans:
        item = items[span.item]
        assert span.count == item.cores and span.first % span.count == 0 and span.first + span.count <= pool
        assert span.end - span.start == pytest.approx(item.hold) and span.asked <= span.start
    assert clashes(spans) == []
    assert {span.worker for span in spans} <= {f"gw{i}" for i in range(workers)}
    # At no instant did a worker hold two items.
    for worker in {span.worker for span in spans}:
        mine = sorted((s for s in spans if s.worker == worker), key=lambda s: s.start)
        assert all(a.end <= b.asked for a, b in itertools.pairwise(mine))

    busy = sum(span.count * (span.end - span.start) for span in spans)
    makespan = max(span.end for span in spans) - min(span.start for span in spans)
    lower_bound = max(busy / pool, max(span.end - span.start for span in spans))
    assert busy == pytest.approx(sum(item.cores * item.hold for item in items))
    assert outcome.utilisation == pytest.approx(busy / (pool * makespan))
    assert outcome.ratio == pytest.approx(makespan / lower_bound)
    assert 0 < outcome.utilisation <= 1 and outcome.ratio >= 1
    assert scale.double_booked(outcome.spans) == []
    # The benchmark's own check finds a double booking when there is one.
    planted = [scale.Span(0, "gw0", 0, 2, 0.0, 0.0, 10.0), scale.Span(1, "gw1", 1, 1, 0.0, 5.0, 6.0)]
    assert scale.double_booked(planted) == [(1, 0, 1)] and clashes(planted) == [(1, 0)]


def test_the_largest_item_gets_its_cores_first_though_smaller_ones_ask_at_the_same_moment(
    scale: ModuleType,
) -> None:
    # One 8-core item and seven 1-core items on 8 cores, 8 workers: all ask at t=0, in an order drawn
    # at random. The 8-core item is first in cost order and must start at the first poll; were a
    # 1-core item granted before it had asked, it would wait for that item to end.
    items = [scale.Item("big", 8, 100.0, 800.0)] + [scale.Item(f"small{i}", 1, 10.0, 10.0) for i in range(7)]
    for seed in range(5):
        outcome = scale.simulate(items, 8, 8, clock=scale.VirtualClock(seed))
        big = next(span for span in outcome.spans if span.item == 0)
        assert big.start == pytest.approx(scale.FIXTURE_POLL), (seed, big)
        assert clashes(list(outcome.spans)) == []
        assert outcome.makespan == pytest.approx(110.0)
