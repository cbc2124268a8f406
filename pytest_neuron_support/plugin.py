"""pytest wiring only: each hook hands its work to the module named for its concern.

- :mod:`.session.options`: the command-line options and their validation;
- :mod:`.session.controller`: the session's setup (catalog, device, settings, results folder) and, on
  the xdist controller, the plugin that hands the device and the plans to workers and makes the
  scheduler;
- :mod:`.session.items`: the catalog collected as :mod:`.session.suite` (one test per check kind,
  parametrized over its models), planned after selection, ordered by cost, sharded;
- :mod:`.session.fixtures`: the public fixtures and markers a user's own test composes;
- :mod:`.session.reporting`: rows out of reports, written crash-safe and then to Parquet;
- :mod:`.session.explain`: what a failed verdict ``assert`` prints.

torch and transformers are never imported here: ``pytest --help`` stays fast, and the controller
process never initialises a device.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from pathlib import Path
from typing import Any

import pytest

# The suite's verdict is a plain assert, made in the suite or in the handle's assert_as_expected():
# rewritten, so pytest_assertrepr_compare explains it (this must come before anything imports them).
pytest.register_assert_rewrite(f"{__package__}.session.suite", f"{__package__}.session.handles")

from pytest_neuron_support.session import controller, explain, fixtures, hooks, options, reporting  # noqa: E402
from pytest_neuron_support.session import items as catalog_items  # noqa: E402


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hooks)
    # The public fixtures and markers live in a module of their own, registered as a plugin so pytest
    # finds its fixtures.
    pluginmanager.register(fixtures, "neuron-support-fixtures")


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    controller.configure(config)
    # After the setup: it decides whether a sweep writes rows (else the fixtures' results writer does).
    fixtures.configure(config)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: every worker leases under this session's id."""
    fixtures.configure_node(node)


def pytest_collect_directory(path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    return catalog_items.collect_directory(path, parent)


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    return catalog_items.collect_file(file_path, parent)


@pytest.hookimpl(trylast=True)  # after -k / -m: only the models that survive selection are planned
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Plan the selected models, then largest work first (cores x expected seconds), then --shard."""
    catalog_items.order_items(config, items)


def pytest_collection_finish(session: pytest.Session) -> None:
    catalog_items.expect_progress(session)


def pytest_report_collectionfinish(config: pytest.Config, start_path: Path, items: Sequence[pytest.Item]) -> list[str]:
    """--collect-only -v: every catalog item's plan (cores, tp/ep, memory per core, reason) before anything runs."""
    return catalog_items.report_plans(config, items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    """A test that used the neuron fixtures gets its row on the report of the phase that decided it."""
    report: pytest.TestReport = yield
    reporting.attach_row(item, call, report)
    return report


def pytest_assertrepr_compare(config: pytest.Config, op: str, left: object, right: object) -> list[str] | None:
    return explain.explain(op, left, right)
