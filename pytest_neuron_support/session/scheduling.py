"""Handing model items to xdist workers in cost order, one at a time.

xdist's default ``load`` scheduler sends each worker a chunk of consecutive items up front.
The sweep's items are sorted largest first, so a chunk puts the two most expensive models
on one worker, one after the other, while the others take the small ones: the worst order
for the makespan. This scheduler deals the items out round-robin in collection order and
then tops a worker up one item at a time as it finishes, so the largest items start first
and on different workers, and the core ledger (``cores.py``) admits them in the same order.

Each worker keeps two items: the one it runs and the next (an xdist worker only starts an
item once it knows the next one, or that there is none).

It is written against xdist's public ``xdist.scheduler.Scheduling`` protocol and the worker
controller's public methods (``send_runtest_some``, ``shutdown``, ``shutting_down``), not by
subclassing ``LoadScheduling`` and calling its private helpers, so an xdist release that
reorganises its own schedulers does not change what this one does.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import pytest
from xdist.workermanage import WorkerController

#: Items a worker holds: the running one and the next.
_PER_WORKER = 2


def collection_diff(first: Sequence[str], other: Sequence[str], first_name: str, other_name: str) -> str | None:
    """What differs between two workers' collections, as a unified diff; None when they agree."""
    if list(first) == list(other):
        return None
    diff = difflib.unified_diff(list(first), list(other), fromfile=first_name, tofile=other_name, lineterm="")
    return f"Different tests were collected between {first_name} and {other_name}. The difference is:\n" + "\n".join(
        diff
    )


class CostOrderScheduling:
    """xdist's ``Scheduling`` protocol: the items in collection order (the plugin sorts them by cost),
    dealt round-robin, then one more item to a worker each time it finishes one."""

    def __init__(self, config: pytest.Config, log: Callable[..., Any], numnodes: int | None = None) -> None:
        from xdist.workermanage import parse_tx_spec_config

        self.config = config
        self.log = log
        # As many workers as the session starts (-n N or --tx specs), unless told.
        self.numnodes = len(parse_tx_spec_config(config)) if numnodes is None else numnodes
        self.node2collection: dict[WorkerController, list[str]] = {}
        self.node2pending: dict[WorkerController, list[int]] = {}
        self.pending: list[int] = []  # indices into collection, in the order they are dealt
        self.collection: list[str] | None = None

    # --- the protocol's state ---------------------------------------------------------------------

    @property
    def nodes(self) -> list[WorkerController]:
        return list(self.node2pending)

    @property
    def collection_is_completed(self) -> bool:
        return len(self.node2collection) >= self.numnodes

    @property
    def tests_finished(self) -> bool:
        return self.collection_is_completed and not self.has_pending

    @property
    def has_pending(self) -> bool:
        return bool(self.pending) or any(self.node2pending.values())

    # --- workers come and go ----------------------------------------------------------------------

    def add_node(self, node: WorkerController) -> None:
        assert node not in self.node2pending
        self.node2pending[node] = []

    def add_node_collection(self, node: WorkerController, collection: Sequence[str]) -> None:
        assert node in self.node2pending
        if self.collection is not None:
            # A replacement worker (one died): it may join only with the collection already dealt.
            message = collection_diff(self.collection, collection, "the first workers", node.gateway.id)
            if message:
                self.log(message)
                return
        self.node2collection[node] = list(collection)

    def remove_node(self, node: WorkerController) -> str | None:
        """The item the node was running when it went down (None after a clean finish); the rest of
        what it held goes back to the front of the queue, in order."""
        pending = self.node2pending.pop(node)
        if not pending:
            return None
        assert self.collection is not None
        crashed = self.collection[pending.pop(0)]
        self.pending[:0] = pending
        for other in self.nodes:
            self._top_up(other)
        return crashed

    # --- items --------------------------------------------------------------------------------------

    def schedule(self) -> None:
        assert self.collection_is_completed
        if self.collection is not None:  # rescheduling, e.g. after a replaced worker
            for node in self.nodes:
                self._top_up(node)
            return
        collections = list(self.node2collection.items())
        (first_node, first), others = collections[0], collections[1:]
        differences = [
            message
            for node, other in others
            if (message := collection_diff(first, other, first_node.gateway.id, node.gateway.id))
        ]
        if differences:
            # As xdist does: say why, as a failed collection report, and run nothing.
            for message in differences:
                self.log(message)
                report = pytest.CollectReport(nodeid="", outcome="failed", longrepr=message, result=[])
                self.config.hook.pytest_collectreport(report=report)
            self.log("**Different tests collected, aborting run**")
            return
        self.collection = list(first)
        self.pending[:] = range(len(self.collection))
        if not self.collection:
            return
        for _ in range(_PER_WORKER):
            for node in self.nodes:
                self._send(node, 1)
        if not self.pending:
            for node in self.nodes:
                node.shutdown()

    def mark_test_complete(self, node: WorkerController, item_index: int, duration: float = 0) -> None:
        self.node2pending[node].remove(item_index)
        self._top_up(node)

    def mark_test_pending(self, item: str) -> None:
        """Run ``item`` again (a crashed item a ``pytest_handlecrashitem`` hook asked to rerun): first."""
        assert self.collection is not None
        self.pending.insert(0, self.collection.index(item))
        for node in self.nodes:
            self._top_up(node)

    def remove_pending_tests_from_node(self, node: WorkerController, indices: Sequence[int]) -> None:
        """Items a worker handed back unrun go to the front of the queue (xdist sends this only after a
        'steal', which this scheduler never asks for; kept correct all the same)."""
        returned = [index for index in self.node2pending[node] if index in set(indices)]
        self.node2pending[node] = [index for index in self.node2pending[node] if index not in set(indices)]
        self.pending[:0] = returned

    def _top_up(self, node: WorkerController) -> None:
        if node.shutting_down:
            return
        if not self.pending:
            node.shutdown()
            return
        missing = _PER_WORKER - len(self.node2pending[node])
        if missing > 0:
            self._send(node, missing)

    def _send(self, node: WorkerController, count: int) -> None:
        items = self.pending[:count]
        if items:
            del self.pending[:count]
            self.node2pending[node].extend(items)
            node.send_runtest_some(items)


if TYPE_CHECKING:
    from xdist.scheduler import Scheduling

    def _conforms(scheduler: CostOrderScheduling) -> Scheduling:
        return scheduler  # mypy proves the class implements xdist's public protocol
