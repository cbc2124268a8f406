"""The check kinds, listed once: the catalog validates ``checks:`` and ``--check`` against them, the
suite has one test per kind (:attr:`~.kind.CheckKind.test`), the fixtures run them, and a catalog
item's node id (``test_model[<Hub id>]``, ``test_training[<Hub id>]``) names its model and its kind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

from pytest_neuron_support.base.model import ModelSpec
from pytest_neuron_support.checks.inference import InferenceCheck
from pytest_neuron_support.checks.kind import CheckKind
from pytest_neuron_support.checks.pipeline import PipelineCheck
from pytest_neuron_support.checks.training import TrainingCheck
from pytest_neuron_support.data.records import Row
from pytest_neuron_support.tasks.table import task_of

#: The kind every row is by default (a user's ``neuron_run`` and ``neuron_reference`` are its parts).
INFERENCE = InferenceCheck()
#: Every kind of check, by the name a row's ``check`` holds; in this order an entry's items are made.
KINDS: Mapping[str, CheckKind] = MappingProxyType(
    {kind.name: kind for kind in (INFERENCE, PipelineCheck(), TrainingCheck())}
)
#: Their names: what ``checks:`` and ``--check`` accept.
CHECKS: tuple[str, ...] = tuple(KINDS)


def checks_of(model: ModelSpec, selected: Sequence[str] | None) -> tuple[str, ...]:
    """The checks a run makes of ``model``: ``--check`` (``selected``) where given, limited to those that
    apply to its task, else the entry's own ``checks``."""
    if selected is None:
        return model.checks
    task = task_of(model.task)
    return tuple(name for name, kind in KINDS.items() if name in selected and kind.applies_to(task))


def item_name(model_id: str, check: str = "inference") -> str:
    """The name of a catalog model's item for ``check`` (the last part of its node id)."""
    return f"{KINDS[check].test}[{model_id}]"


def _parse(nodeid: str) -> tuple[str, str] | None:
    name = nodeid.rsplit("::", 1)[-1]
    for check, kind in KINDS.items():
        if name.startswith(f"{kind.test}[") and name.endswith("]"):
            return name[len(kind.test) + 1 : -1], check
    return None


def model_id_of(nodeid: str) -> str | None:
    """The model id of a catalog item's node id; None for any other test."""
    parsed = _parse(nodeid)
    return None if parsed is None else parsed[0]


def check_of(nodeid: str) -> str | None:
    """The check a catalog item's node id makes (``inference``, ``train``); None for any other test."""
    parsed = _parse(nodeid)
    return None if parsed is None else parsed[1]


def named_test(row: Row) -> str:
    """The test that made ``row``: a user's test's node id, else its catalog item's name."""
    return row.test or item_name(row.model_id, row.check)
