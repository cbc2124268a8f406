"""pytest wiring only: each hook hands its work to the module named for its concern.

- :mod:`.options`: the command-line options and their validation;
- :mod:`.controller`: the session's setup (catalog, device, settings, results folder) and, on the
  xdist controller, the plugin that hands the device to workers and makes the scheduler;
- :mod:`.items`: the catalog's entries as pytest items, planned, ordered by cost, sharded;
- :mod:`.reporting`: rows out of reports, written crash-safe and then to Parquet;
- :mod:`.fixtures`: the public fixtures and markers a user's own test composes.

torch and transformers are never imported here: ``pytest --help`` stays fast, and the controller
process never initialises a device.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from . import controller, hooks, options
from . import items as catalog_items


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hooks)
    # The public fixtures and markers; fixtures.py builds on the modules above, so it is imported once they are.
    from . import fixtures

    pluginmanager.register(fixtures, "neuron-support-fixtures")


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    controller.configure(config)


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    return catalog_items.collect_file(file_path, parent)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Largest work first (cores x expected seconds), so the sweep's makespan stays short."""
    catalog_items.order_items(config, items)
