"""Live progress of a sweep, on the controller: a line when a model starts and when it ends (model,
cores, result, stage, elapsed), a status line every ``--progress-interval`` seconds (running
with their stage, done, left, and the time left estimated from the items' expected costs), and
``<results>/status.json``, rewritten at every change, from which ``neuron-support status`` prints
the same from another shell, with the host's core leases (who holds which cores since when).

The controller knows which items run (``pytest_runtest_logstart``, from xdist workers too) and
their plans; the stage a running model is at is read from its run folder (the last
``[neuron-support] stage=`` marker run.py printed to its log, or the CPU check / judge folder
written after it), so neither the worker nor run.py reports anything for progress' sake. ``-q``
silences the lines; status.json is written either way. A ``--collect-only`` session runs nothing, so it
neither prints nor writes: status.json keeps describing the last session that ran items.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_neuron_support.base.storage import write_atomic
from pytest_neuron_support.checks.registry import check_of
from pytest_neuron_support.run.execution import last_stage
from pytest_neuron_support.run.settings import run_dir
from pytest_neuron_support.session.reporting import row_from_report

STATUS_FILE = "status.json"
#: The plugin name of the progress lines (controller only).
PROGRESS_PLUGIN = "neuron-support-progress"


@dataclass(frozen=True)
class Planned:
    """What the controller expects of one item.

    Attributes:
        nodeid: the item.
        model_id: its model (the node id for a test that checks none).
        cores: the cores its plan leases (0 when it runs none: skipped, excluded, unplanned).
        expected_s: seconds it is expected to take (the dataset's history, else the planner's prior).
    """

    nodeid: str
    model_id: str
    cores: int
    expected_s: float


@dataclass
class Running:
    """An item that has started and not ended (``since``: epoch seconds)."""

    nodeid: str
    model_id: str
    cores: int
    since: float


@dataclass
class State:
    """What status.json holds (mutable on the controller; read back by ``neuron-support status``)."""

    pid: int
    device: str
    pool: int
    ledger: str
    started: float
    updated: float = 0.0
    finished: bool = False
    total: int = 0
    done: int = 0
    results: dict[str, int] = field(default_factory=dict)
    running: list[Running] = field(default_factory=list)
    left_s: float | None = None


def label(nodeid: str, model_id: str) -> str:
    """How the progress lines name an item: its model, and the check where it is not inference."""
    check = check_of(nodeid)
    return model_id if check in (None, "inference") else f"{model_id} ({check})"


def stage_of(results_dir: Path, device: str, model_id: str, since: float, check: str = "inference") -> str:
    """The stage a running model is at, from what its run folder holds (written after ``since``)."""
    runs = run_dir(results_dir, device, model_id)
    if check == "train":
        # train.py's own markers (load, compile = step 1, train), then the CPU side's steps.
        runs = runs / "train"
        if fresh_path(runs / "device" / "result.json", since):
            return "verdict" if fresh_path(runs / "cpu" / "result.json", since) else "cpu steps"

    def fresh(path: Path) -> bool:
        return fresh_path(path, since)

    for name in ("judge", "cpu-check"):  # after the device run, in the order the pipeline runs them
        if fresh(runs / name):
            return name
    if fresh(runs / "device" / "result.json"):
        # The device run is over; the one-core CPU reference (started beside it) may still run.
        done = fresh(runs / "reference" / "result.json") or not fresh(runs / "reference")
        return "verdict" if done else "reference"
    log = runs / "device" / "log.txt"
    if not fresh(log):
        return "start" if fresh(runs / "device") else "waiting for cores"
    try:
        return last_stage(log.read_text(errors="replace"))
    except OSError:
        return "start"


def fresh_path(path: Path, since: float) -> bool:
    """The path exists and was written at or after ``since`` (by this run, not an earlier one)."""
    try:
        return path.stat().st_mtime >= since
    except OSError:
        return False


def duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def status_lines(state: State, results_dir: Path, now: float) -> list[str]:
    """The status line, then one line per running item (model, cores, worker, stage, elapsed)."""
    left = state.total - state.done - len(state.running)
    estimate = "" if state.left_s is None else f"; about {duration(state.left_s)} left (from expected costs)"
    head = f"{len(state.running)} running, {state.done} done, {left} waiting of {state.total}{estimate}"
    if state.results:
        head += " (" + ", ".join(f"{n} {result}" for result, n in sorted(state.results.items())) + ")"
    lines = [head]
    for item in sorted(state.running, key=lambda r: r.since):
        stage = stage_of(results_dir, state.device, item.model_id, item.since, check_of(item.nodeid) or "inference")
        name = label(item.nodeid, item.model_id)
        lines.append(f"  {name}: {item.cores} core(s), {stage}, {duration(now - item.since)} since it started")
    return lines


class Progress:
    """Controller-only plugin: the start / end lines, the periodic status line, status.json."""

    def __init__(
        self,
        config: pytest.Config,
        results_dir: Path,
        device: str,
        pool: int,
        ledger: Path | None,
        interval: float,
    ) -> None:
        self.config = config
        self.results_dir = results_dir
        self.interval = interval
        self.quiet = config.get_verbosity() < 0
        # A collect-only session would leave a status.json of a "finished" sweep with every item
        # waiting, over the one of the sweep that last ran.
        self.records = not config.option.collectonly
        self.planned: dict[str, Planned] = {}
        self.state = State(pid=os.getpid(), device=device, pool=pool, ledger=str(ledger or ""), started=time.time())
        self._outcomes: dict[str, tuple[str, str | None]] = {}
        self._finished: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- what the sweep will run ---------------------------------------------------------------

    def expect(self, planned: Mapping[str, Planned]) -> None:
        """The items of the session (after selection), with their plans and expected seconds."""
        with self._lock:
            self.planned = dict(planned)
            self.state.total = len(self.planned)
            self._estimate(time.time())
        self._save()
        if self._thread is None and self.interval > 0 and self.records:
            self._thread = threading.Thread(target=self._tick, name="neuron-support-progress", daemon=True)
            self._thread.start()

    # --- hooks -----------------------------------------------------------------------------------

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        planned = self.planned.get(nodeid)
        if planned is None:
            return
        with self._lock:
            self.state.running.append(Running(nodeid, planned.model_id, planned.cores, time.time()))
            self._estimate(time.time())
        cores = f"{planned.cores} core(s)" if planned.cores else "no cores"
        self._line(f"start {label(nodeid, planned.model_id)}: {cores}, expected {duration(planned.expected_s)}")
        self._save()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.nodeid not in self.planned:
            return
        row = row_from_report(report)
        with self._lock:
            if row is not None:
                self._outcomes[report.nodeid] = (row.result, row.failure_stage)
            elif report.failed and report.nodeid not in self._outcomes:
                self._outcomes[report.nodeid] = ("ERROR", report.when)

    def pytest_runtest_logfinish(self, nodeid: str, location: Any) -> None:
        planned = self.planned.get(nodeid)
        if planned is None:
            return
        now = time.time()
        with self._lock:
            running = next((r for r in self.state.running if r.nodeid == nodeid), None)
            if running is not None:
                self.state.running.remove(running)
            self.state.done += 1
            self._finished.add(nodeid)
            outcome = self._outcomes.pop(nodeid, ("resumed", None))
            self.state.results[outcome[0]] = self.state.results.get(outcome[0], 0) + 1
            self._estimate(now)
        elapsed = f" in {duration(now - running.since)}" if running is not None else ""
        stage = f" at {outcome[1]}" if outcome[1] else ""
        self._line(
            f"end   {label(planned.nodeid, planned.model_id)}: {outcome[0]}{stage}{elapsed}; " + self._head_line(now)
        )
        self._save()

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self._stop.set()
        with self._lock:
            self.state.finished = True
            self.state.running.clear()
        self._save()

    # --- internals -------------------------------------------------------------------------------

    def _estimate(self, now: float) -> None:
        """Work left (core-seconds of the waiting items and the rest of the running ones) over the pool."""
        running = {r.nodeid: r for r in self.state.running}
        work = 0.0
        for item in running.values():
            expected = self.planned[item.nodeid].expected_s
            work += max(expected - (now - item.since), 0.0) * max(item.cores, 1)
        for planned in self.planned.values():
            if planned.nodeid not in running and planned.nodeid not in self._finished:
                work += planned.expected_s * max(planned.cores, 1)
        # A lower bound on the time left: the pool kept busy, the items as long as they are expected.
        self.state.left_s = round(work / max(self.state.pool, 1), 1)

    def _head_line(self, now: float) -> str:
        return status_lines(self.state, self.results_dir, now)[0]

    def _line(self, text: str) -> None:
        if self.quiet:
            return
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            with self._lock:
                # After pytest's progress dots (xdist's too) the line starts on a line of its own.
                writer = getattr(reporter, "_tw", None)
                if writer is not None and getattr(writer, "width_of_current_line", None):
                    reporter.write("\n")
                reporter.write_line(f"[neuron-support] {text}")

    def _tick(self) -> None:
        while not self._stop.wait(self.interval):
            now = time.time()
            with self._lock:
                self._estimate(now)
                lines = status_lines(self.state, self.results_dir, now)
            for line in lines:
                self._line(line)
            self._save()

    def _save(self) -> None:
        if not self.records:
            return
        with self._lock:
            self.state.updated = time.time()
            data = asdict(self.state)
        with contextlib.suppress(OSError):  # progress must never cost the sweep
            write_atomic(self.results_dir / STATUS_FILE, json.dumps(data, indent=1))


def read_status(results_dir: Path) -> State | None:
    """status.json of a results folder, None when there is none."""
    try:
        data = json.loads((results_dir / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return None
    running = [Running(**item) for item in data.pop("running", ())]
    return State(**data, running=running)
