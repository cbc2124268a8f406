"""Rows out of reports: each item's row travels in its report (``user_properties``, from xdist
workers too; a crashed worker's item through ``pytest_handlecrashitem``), and the controller's
:class:`ResultsWriter` keeps every row crash-safe as it arrives and writes the Parquet dataset at
the end, like pytest's junitxml.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pytest_neuron_support.base.model import ModelSpec
from pytest_neuron_support.base.storage import slug, write_atomic
from pytest_neuron_support.checks.registry import KINDS, check_of, model_id_of
from pytest_neuron_support.checks.rows import base_row
from pytest_neuron_support.data.dataset import PartWriter, dump_rows, near_tie_pass, write_rows
from pytest_neuron_support.data.records import Row
from pytest_neuron_support.run.settings import Settings
from pytest_neuron_support.session.evidence import catalog_row, evidence_of, user_row, uses_fixtures
from pytest_neuron_support.session.keys import model_key
from pytest_neuron_support.session.resolve import session_settings

ROW_PROPERTY = "neuron_support_row"
#: The plugin name of the controller's results writer (a sweep's, or :class:`LazyResults`'s).
RESULTS_PLUGIN = "neuron-support-results-writer"
#: The file a user's test that uses the neuron fixtures leaves as it starts, so the controller can
#: write its row if its worker dies mid-test (the test's own row never reaches the controller).
STARTED = "started.json"


def user_test_dir(results_dir: Path, nodeid: str) -> Path:
    """Where a user's test keeps its runs and its start marker: ``runs/tests/<node id>/``."""
    return results_dir / "runs" / "tests" / slug(nodeid)


def mark_started(results_dir: Path, nodeid: str, model_id: str | None) -> None:
    """A user's test that uses the fixtures has started (on a worker): what its crash row needs."""
    # Written anew each time (its time says which session it belongs to).
    write_atomic(user_test_dir(results_dir, nodeid) / STARTED, json.dumps({"nodeid": nodeid, "model_id": model_id}))


def crashed_test_row(settings: Settings, nodeid: str, longrepr: object, since: float) -> Row | None:
    """The row of a user's test whose worker died while running it; None when the test never started
    a neuron fixture in this session (a plain test has no row)."""
    marker = user_test_dir(settings.results_dir, nodeid) / STARTED
    try:
        if marker.stat().st_mtime < since:
            return None  # left by an earlier session
        started = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    model_id = started.get("model_id") or nodeid
    return replace(
        base_row(ModelSpec(id=model_id, source="test"), settings),
        test=nodeid,
        source="test",
        failure_stage="harness",
        verdict_basis="test",
        error=f"the pytest worker died while running this test: {longrepr}",
    )


def row_from_report(report: pytest.TestReport) -> Row | None:
    # Every phase's report carries a catalog item's user_properties (read its call's); a user's test
    # attaches its row to the report that decided it: its call, or a setup that failed or skipped.
    # xdist's report of a crashed worker (when "???") carries the row pytest_handlecrashitem made.
    if report.when not in ("call", "setup", "???"):
        return None
    for name, value in report.user_properties:
        if name == ROW_PROPERTY:
            return Row.from_json(str(value))
    return None


class ResultsWriter:
    """Controller-only: collects rows from (xdist worker) reports, like pytest's junitxml.

    Each row is written crash-safely the moment its item reports; at session end the rows
    are merged into the Parquet dataset.
    """

    def __init__(self, settings: Settings, models: tuple[ModelSpec, ...]) -> None:
        self.settings = settings
        self.models = {model.id: model for model in models}
        self.parts = PartWriter(settings.results_dir)
        self.rows: list[Row] = []
        self.written: list[Path] = []
        # Rows the results directory refused (disk filled mid-sweep): kept in memory, never dropped.
        self.unsaved: list[Row] = []
        self.write_error: OSError | None = None
        self.rescued: Path | None = None
        self.started = time.time()

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched: Any) -> None:
        """xdist: a worker died while running ``crashitem`` (its report follows). A catalog item's row
        never reached the controller, so the controller writes one; the sweep goes on with a new worker."""
        model_id = model_id_of(crashitem)
        model = None if model_id is None else self.models.get(model_id)
        if model is None:
            # A user's test that started a neuron fixture left a marker; a plain test has no row.
            row = crashed_test_row(self.settings, crashitem, report.longrepr, self.started)
        else:
            kind = KINDS[check_of(crashitem) or "inference"]
            row = replace(
                kind.planned(base_row(model, self.settings), model, self.settings),
                failure_stage="harness",
                verdict_basis="run",
                error=f"the pytest worker died while checking this model: {report.longrepr}",
            )
        if row is not None:
            report.user_properties.append((ROW_PROPERTY, row.to_json()))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        row = row_from_report(report)
        if row is None:
            return
        self.rows.append(row)
        try:
            self.parts.add(row)
        except OSError as exc:
            self.unsaved.append(row)
            self.write_error = exc

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        try:
            self.written = write_rows(self.settings.results_dir, [*self.parts.rows(), *self.unsaved])
            shutil.rmtree(self.parts.directory, ignore_errors=True)
        except OSError as exc:
            self.write_error = exc
            self._rescue(session)

    def _rescue(self, session: pytest.Session) -> None:
        """The results directory refused the dataset: put every row somewhere else, and fail."""
        rows = [*self.parts.rows(), *self.unsaved]
        with contextlib.suppress(OSError):
            self.rescued = dump_rows(rows, Path(tempfile.mkdtemp(prefix="neuron-support-unsaved-")))
        session.exitstatus = pytest.ExitCode.INTERNAL_ERROR

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.rows:
            return
        tr = terminalreporter
        tr.section("neuron-support results")
        # A model's training row is named apart from its inference row (a row per check).
        names = {id(r): r.model_id if r.check == "inference" else f"{r.model_id} ({r.check})" for r in self.rows}
        width = max(len(name) for name in names.values())
        tr.write_line(
            f"{'model':<{width}}  {'result':<8} {'stage':<9} {'parity':<8} {'cores':>5} {'run_s':>8} {'compile_s':>9}"
            "  evidence"
        )
        for row in sorted(self.rows, key=lambda r: (r.model_id, r.check)):
            run_s = f"{row.run_s:.1f}" if row.run_s is not None else "-"
            compile_s = f"{row.compile_s:.1f}" if row.compile_s is not None else "-"
            cores = row.neuron_cores if row.neuron_cores is not None else "-"
            # A PASS that ran operations on the host says so on its own line of the table.
            host = (
                f"; {len(row.fallback_ops)} op(s) ran on the host: {', '.join(row.fallback_ops)}"
                if row.fallback_ops
                else ""
            )
            # A PASS whose tokens parted from the CPU's at a near-tie is marked apart from an exact one.
            tie = "; a near-tie PASS: the tokens part from the CPU's at a near-tie" if near_tie_pass(row) else ""
            tr.write_line(
                f"{names[id(row)]:<{width}}  {row.result:<8} {row.failure_stage or '-':<9} {row.parity_mode or '-':<8} "
                f"{cores:>5} {run_s:>8} {compile_s:>9}  {row.verdict_basis or '-'}{tie}{host}"
            )
        counts: dict[str, int] = {}
        for row in self.rows:
            counts[row.result] = counts.get(row.result, 0) + 1
        tr.write_line(", ".join(f"{n} {result}" for result, n in sorted(counts.items())))
        for path in self.written:
            tr.write_line(f"Parquet: {path}")
        if self.write_error is not None:
            results = self.settings.results_dir
            tr.write_line(f"could not write rows to {results}: {self.write_error}", red=True, bold=True)
            if self.rescued is not None:
                tr.write_line(
                    f"all {len(self.rows)} rows were saved in {self.rescued}; free space, then recover them with: "
                    f"neuron-support merge {self.rescued} --into {results}",
                    red=True,
                )
            else:
                tr.write_line("no other directory took them either; the rows, one JSON per line:", red=True)
                for row in self.rows:
                    tr.write_line(row.to_json())
        data = self.settings.results_dir / "data"
        tr.write_line(f"Read it back: pandas.read_parquet({json.dumps(str(data))})")


class LazyResults:
    """Controller of a session without a catalog: the results writer, made when the first row arrives
    (so a session whose tests use no neuron fixture writes nothing and resolves no device)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.writer: ResultsWriter | None = None
        self.started = time.time()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.writer is None:
            if row_from_report(report) is None:
                return
            self.writer = ResultsWriter(session_settings(self.config), ())
        self.writer.pytest_runtest_logreport(report)

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched: Any) -> None:
        """xdist: a worker died mid-test; a test that had started a neuron fixture still gets its row."""
        settings = session_settings(self.config)
        row = crashed_test_row(settings, crashitem, report.longrepr, self.started)
        if row is not None:
            report.user_properties.append((ROW_PROPERTY, row.to_json()))

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.writer is not None:
            self.writer.pytest_sessionfinish(session)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.writer is not None:
            self.writer.pytest_terminal_summary(terminalreporter)


def attach_row(item: pytest.Item, call: pytest.CallInfo[None], report: pytest.TestReport) -> None:
    """The row of a test that used the neuron fixtures rides on the report of the phase that decided
    it (the call, or a setup that failed or skipped), as a catalog item's does (``user_properties``, so it
    travels from xdist workers like junitxml data)."""
    deciding = report.when == "call" or (report.when == "setup" and report.outcome != "passed")
    if deciding and uses_fixtures(item):
        try:
            settings = session_settings(item.config)
        except pytest.UsageError:  # the session cannot run anything; the setup error says why
            return
        evidence = evidence_of(item)
        if evidence.resumed:  # its row is already in the dataset
            return
        if model_key in item.stash:
            row = catalog_row(item, evidence, report, settings)
        else:
            row = user_row(item, evidence, report, call, settings)
        report.user_properties.append((ROW_PROPERTY, row.to_json()))
