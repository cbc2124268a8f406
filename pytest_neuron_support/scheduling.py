"""Handing model items to xdist workers in cost order, one at a time.

xdist's default ``load`` scheduler sends each worker a chunk of consecutive items up front.
The sweep's items are sorted largest first, so a chunk puts the two most expensive models
on one worker, one after the other, while the others take the small ones: the worst order
for the makespan. This scheduler deals the items out round-robin in collection order and
then tops a worker up one item at a time as it finishes, so the largest items start first
and on different workers, and the core ledger (``cores.py``) admits them in the same order.

Each worker keeps two items: the one it runs and the next (an xdist worker only starts an
item once it knows the next one, or that there is none).
"""

from __future__ import annotations

from xdist.scheduler import LoadScheduling
from xdist.workermanage import WorkerController

#: Items a worker holds: the running one and the next.
_PER_WORKER = 2


class CostOrderScheduling(LoadScheduling):  # type: ignore[misc]
    """``--dist load`` with the initial deal round-robin and top-ups of one item at a time."""

    def schedule(self) -> None:
        assert self.collection_is_completed
        if self.collection is not None:  # type: ignore[has-type]  # rescheduling, e.g. a replaced worker
            for node in self.nodes:
                self.check_schedule(node)
            return
        if not self._check_nodes_have_same_collection():
            self.log("**Different tests collected, aborting run**")
            return
        collection: list[str] = next(iter(self.node2collection.values()))
        self.collection = collection
        self.pending[:] = range(len(collection))
        if not collection:
            return
        for _ in range(_PER_WORKER):
            for node in self.nodes:
                if self.pending:
                    self._send_tests(node, 1)
        if not self.pending:
            for node in self.nodes:
                node.shutdown()

    def check_schedule(self, node: WorkerController, duration: float = 0) -> None:
        if node.shutting_down:
            return
        if not self.pending:
            node.shutdown()
            return
        missing = _PER_WORKER - len(self.node2pending[node])
        if missing > 0:
            self._send_tests(node, min(missing, len(self.pending)))
