"""The names of the catalog's items: ``test_model[<id>]`` for the inference check, ``test_training[<id>]``
for training, and the way back from a node id to its model and check.

A room of its own below everything that reads these names (the suite that defines the tests, the
controller that plans by them, the reporting hook, the progress ticker and the dataset, which names a
row by its test): it imports nothing of the package, so none of them imports another to learn a name.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

#: The catalog's inference test: its items are ``test_model[<Hub id>]``.
TEST_NAME = "test_model"
#: check -> the catalog test that makes it (each parametrized over the entries that ask for it).
TEST_NAMES: Mapping[str, str] = MappingProxyType({"inference": TEST_NAME, "train": "test_training"})


def item_name(model_id: str, check: str = "inference") -> str:
    """The name of a catalog model's item for ``check`` (the last part of its node id)."""
    return f"{TEST_NAMES[check]}[{model_id}]"


def _parse(nodeid: str) -> tuple[str, str] | None:
    name = nodeid.rsplit("::", 1)[-1]
    for check, test in TEST_NAMES.items():
        if name.startswith(f"{test}[") and name.endswith("]"):
            return name[len(test) + 1 : -1], check
    return None


def model_id_of(nodeid: str) -> str | None:
    """The model id of a catalog item's node id; None for any other test."""
    parsed = _parse(nodeid)
    return None if parsed is None else parsed[0]


def check_of(nodeid: str) -> str | None:
    """The check a catalog item's node id makes (``inference``, ``train``); None for any other test."""
    parsed = _parse(nodeid)
    return None if parsed is None else parsed[1]
