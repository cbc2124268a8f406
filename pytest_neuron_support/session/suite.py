"""The catalog suite: one test per check kind, parametrized over the catalog, written with the public
fixtures.

Every entry of ``models.yaml`` (and every ``--model``) is one item of :func:`test_model` (the
inference check), its id the Hub id (``models.yaml::test_model[Qwen/Qwen3-0.6B]``), so ``-k qwen``
selects by id and by the entry's tags; an entry that asks for the training check (``checks: [...,
train]``, or ``--check train``) is also an item of :func:`test_training`
(``models.yaml::test_training[Qwen/Qwen3-0.6B]``: ``-k training`` selects those, ``-k "not training"``
the rest), and one that asks for the pipeline check (``checks: [..., pipeline]``) an item of
:func:`test_pipeline`. Each test is its kind's (``checks.registry.KINDS``: a kind names its test and its fixture).
The item's fixtures do what a user's own test would compose: ``neuron_model`` (the entry; an excluded
one is skipped with its reason), ``neuron_plan`` (the plan the controller made), and the kind's fixture
(``neuron_check``, ``neuron_pipeline_check``, ``neuron_train_check``), which leases the plan's cores,
runs the check on the device and the CPU and returns the row. The verdict is ``assert result == "PASS"``
(``ModelCheck.assert_as_expected``); when it fails, pytest shows the evidence (matched prefix, first
divergence, both tokens, their gap: :mod:`.explain`). An entry with an ``expect:`` (a known failure and
why) is an XFAIL while it fails that way, and a failed XPASS(strict) once it passes.

This module is collected by :class:`.items.CatalogFile` from the catalog file itself; it is not a
file pytest finds on its own, so the plugin works wherever it is installed.
"""

from __future__ import annotations

import pytest

from pytest_neuron_support.checks.registry import KINDS, checks_of
from pytest_neuron_support.session.handles import ModelCheck
from pytest_neuron_support.session.keys import catalog_key, options_key


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One item per catalog model that this test's check applies to, the model spec handed to
    ``neuron_model`` (indirect)."""
    check = next(name for name, kind in KINDS.items() if kind.test == metafunc.function.__name__)
    options = metafunc.config.stash.get(options_key, None)
    selected = None if options is None else options.checks
    models = [m for m in metafunc.config.stash.get(catalog_key, ()) if check in checks_of(m, selected)]
    # No entry asks for this check: pytest makes one "empty parameter set" item, which
    # items.CatalogFile drops (a check nobody asked for is no item at all).
    metafunc.parametrize("neuron_model", models, ids=[model.id for model in models], indirect=True)


def test_model(neuron_check: ModelCheck) -> None:
    """Does this Hub model run unmodified on the device? PASS when the device's output is the CPU's."""
    neuron_check.assert_as_expected()


def test_pipeline(neuron_pipeline_check: ModelCheck) -> None:
    """Does this Hub model run on the device through ``transformers.pipeline(task, model=id, device=...)``?
    PASS when the pipeline put the model on the device and its output is the direct path's CPU output."""
    neuron_pipeline_check.assert_as_expected()


def test_training(neuron_train_check: ModelCheck) -> None:
    """Does this Hub model fine-tune unmodified on the device? PASS when a few Trainer steps' losses are
    finite, agree with the same steps on CPU step by step, and nothing recompiles after the first."""
    neuron_train_check.assert_as_expected()
