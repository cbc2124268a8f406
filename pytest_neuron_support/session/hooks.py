"""Hook specifications other plugins and conftest files may implement."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pytest_neuron_support.base.model import ModelSpec


@pytest.hookspec(firstresult=True)
def pytest_neuron_support_post_load(config: pytest.Config, model: ModelSpec) -> str | None:
    """Return Python source that the device run.py (and the device train.py of the training check)
    executes right after loading the model.

    The code runs with ``model``, ``torch`` and ``SPEC`` bound, is written into the script (so
    the stored script still reproduces the run), and never runs in the CPU reference or the CPU
    side of the training check. Use it
    to patch a known issue while checking a model, or in tests to perturb a device run.
    """
