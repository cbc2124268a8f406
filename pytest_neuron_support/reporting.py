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
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from .catalog import ModelSpec
from .dataset import (
    PartWriter,
    dump_rows,
    write_rows,
)
from .pipeline import (
    Settings,
    base_row,
)
from .records import Row

ROW_PROPERTY = "neuron_support_row"
writer_key = pytest.StashKey["ResultsWriter"]()


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

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched: Any) -> None:
        """xdist: a worker died while running ``crashitem`` (its report follows). A catalog item's row
        never reached the controller, so the controller writes one; the sweep goes on with a new worker."""
        model = self.models.get(crashitem.rsplit("::", 1)[-1])  # a catalog item is named by its model id
        if model is None:
            return  # not a catalog item (a user's test attaches its own row; a plain test has none)
        row = replace(
            base_row(model, self.settings),
            failure_stage="harness",
            verdict_basis="run",
            error=f"the pytest worker died while checking this model: {report.longrepr}",
        )
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
        width = max(len(r.model_id) for r in self.rows)
        tr.write_line(
            f"{'model':<{width}}  {'result':<8} {'stage':<9} {'cores':>5} {'run_s':>8} {'compile_s':>9}  evidence"
        )
        for row in sorted(self.rows, key=lambda r: r.model_id):
            run_s = f"{row.run_s:.1f}" if row.run_s is not None else "-"
            compile_s = f"{row.compile_s:.1f}" if row.compile_s is not None else "-"
            cores = row.neuron_cores if row.neuron_cores is not None else "-"
            # A PASS that ran operations on the host says so on its own line of the table.
            host = (
                f"; {len(row.fallback_ops)} op(s) ran on the host: {', '.join(row.fallback_ops)}"
                if row.fallback_ops
                else ""
            )
            tr.write_line(
                f"{row.model_id:<{width}}  {row.result:<8} {row.failure_stage or '-':<9} "
                f"{cores:>5} {run_s:>8} {compile_s:>9}  {row.verdict_basis or '-'}{host}"
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
