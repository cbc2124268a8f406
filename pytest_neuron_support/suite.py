"""The catalog suite: one test, parametrized over the catalog, written with the public fixtures.

Every entry of ``models.yaml`` (and every ``--model``) is one item of :func:`test_model`, its id the
Hub id (``models.yaml::test_model[Qwen/Qwen3-0.6B]``), so ``-k qwen`` selects by id and by the
entry's tags. The item's fixtures do what a user's own test would compose: ``neuron_model`` (the
entry; an excluded one is skipped with its reason), ``neuron_plan`` (the plan the controller made),
and ``neuron_check``, which leases the plan's cores, runs run.py on the device and the CPU checks
and returns the row. The verdict is the plain ``assert`` below; when it fails, pytest shows the
evidence (matched prefix, first divergence, both tokens, their gap: :mod:`.explain`).

This module is collected by :class:`.items.CatalogFile` from the catalog file itself; it is not a
file pytest finds on its own, so the plugin works wherever it is installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .fixtures import ModelCheck

#: The catalog test's name: its items are ``test_model[<Hub id>]``.
TEST_NAME = "test_model"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One item per catalog model, the model spec handed to ``neuron_model`` (indirect)."""
    from .controller import catalog_key

    models = metafunc.config.stash.get(catalog_key, ())
    metafunc.parametrize("neuron_model", list(models), ids=[model.id for model in models], indirect=True)


def test_model(neuron_check: ModelCheck) -> None:
    """Does this Hub model run unmodified on the device? PASS when the device's tokens are the CPU's."""
    assert neuron_check.result == "PASS"


def item_name(model_id: str) -> str:
    """The name of a catalog model's item (the last part of its node id)."""
    return f"{TEST_NAME}[{model_id}]"


def model_id_of(nodeid: str) -> str | None:
    """The model id of a catalog item's node id; None for any other test."""
    name = nodeid.rsplit("::", 1)[-1]
    if name.startswith(f"{TEST_NAME}[") and name.endswith("]"):
        return name[len(TEST_NAME) + 1 : -1]
    return None
