"""The repository's own suite settings (the plugin itself needs none of this; it works wherever it is
installed).

At the repository root, ``pytest`` runs the Selected catalog (``testpaths = ["models.yaml"]`` in
pyproject.toml): ``pytest --neuron-cores=16 -k qwen`` on a trn2 host. ``pytest tests`` runs the
project's own tests. This file keeps the two apart:

- a sweep that walks the whole repository (``pytest .``) runs the catalog only: the project's tests
  (hundreds of CPU runs of the tiny zoo) never ride along a device sweep, and its results stay rows
  of models only;
- the header says which of the two a session runs, so a log shows it at its top;
- ``benchmarks/`` and ``docs/`` are never collected (scripts and prose, not tests).
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
TESTS = ROOT / "tests"

collect_ignore = ["benchmarks", "docs"]


def _named(config: pytest.Config, path: Path) -> bool:
    """Whether a command-line argument names ``path`` or something inside it."""
    for arg in config.args:
        named = Path(arg.split("::")[0]).resolve()
        if named == path or named.is_relative_to(path):
            return True
    return False


def _sweep(config: pytest.Config) -> bool:
    from pytest_neuron_support.session.keys import catalog_key

    return catalog_key in config.stash


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if collection_path == TESTS and _sweep(config) and not _named(config, TESTS):
        return True
    return None


def pytest_report_header(config: pytest.Config) -> str:
    if _sweep(config):
        from pytest_neuron_support.session.keys import catalog_key, options_key

        models = config.stash[catalog_key]
        return f"suite: the catalog {config.stash[options_key].models_file.name} ({len(models)} models)"
    if _named(config, TESTS):
        return "suite: the project's own tests (tests/)"
    return "suite: as named on the command line"


#: Where .ci/run asks for the tally of the project's own tests: every collected test id and how each
#: ended, so .ci/tally.py can check that every collected test ran and that each skip is allowed. Read
#: once, on the controller, and removed from the environment at once: the xdist workers and the pytest
#: sessions the tests start must not write it.
TALLY_ENV = "NEURON_SUPPORT_TEST_TALLY"


class _Tally:
    """Collected ids (from the first xdist worker that collected, or this session) and outcomes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.collected: list[str] = []
        self.outcomes: dict[str, str] = {}
        self.skips: dict[str, str] = {}

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: object, ids: list[str]) -> None:
        if not self.collected:
            self.collected = list(ids)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if session.items and not self.collected:
            self.collected = [item.nodeid for item in session.items]

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed and report.when != "call":
            self.outcomes[report.nodeid] = "error"
        elif report.skipped and report.when in ("setup", "call"):
            xfail = hasattr(report, "wasxfail")
            self.outcomes[report.nodeid] = "xfailed" if xfail else "skipped"
            if not xfail and isinstance(report.longrepr, tuple):
                self.skips[report.nodeid] = str(report.longrepr[2])
        elif report.when == "call":
            self.outcomes.setdefault(report.nodeid, report.outcome)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        import json

        tally = {"collected": self.collected, "outcomes": self.outcomes, "skips": self.skips}
        self.path.write_text(json.dumps(tally, indent=1), encoding="utf-8")


def pytest_configure(config: pytest.Config) -> None:
    import os

    path = os.environ.pop(TALLY_ENV, None)
    if path and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_Tally(Path(path)), "neuron-support-test-tally")
