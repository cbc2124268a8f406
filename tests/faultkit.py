"""Shared by the end-to-end test modules: a catalog of tiny-zoo models, an outcome check that shows
a session's rows when it fails, and a finder for the processes a test started.

The finder recognises a test's processes by a tag in their environment, not by their command
line: a marker such as the model's slug also matches another xdist worker's sweep of the same
model, never matches a rank started by multiprocessing spawn (its command line is ``python -c
"from multiprocessing.spawn import ..."``), and a process tree walk misses an orphan reparented
to init. Every descendant inherits the environment, and /proc/<pid>/environ keeps showing it
after the process is reparented.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_neuron_support import zoo

TAG_VAR = "NEURON_SUPPORT_TEST_TAG"


def catalog(*ids: str) -> str:
    prompt = json.dumps(zoo.TINY_PROMPT)
    return "models:\n" + "".join(f"  - {{id: {i}, task: text-generation, prompt: {prompt}}}\n" for i in ids)


@dataclass(frozen=True)
class Process:
    """A live process that carries a test's tag: its cwd and command line say what it is when a
    check fails."""

    pid: int
    cwd: str
    cmdline: str


def planted_hub(offline_hub: Path, tmp_path: Path, monkeypatch: Any, repo: str, *ids: str) -> Path:
    """A private copy of the zoo cache holding ``repo``'s checkpoint under each of ``ids`` too (so one session runs
    it clean and with each planted fault), made this test's Hugging Face cache."""
    import shutil

    cache = tmp_path / "hub"
    shutil.copytree(offline_hub, cache, symlinks=True)
    snapshot = next((cache / f"models--{repo.replace('/', '--')}" / "snapshots").iterdir())
    for planted in ids:
        zoo.install_snapshot(cache, planted, snapshot)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def planted_conftest(code_by_id: dict[str, str]) -> str:
    """A conftest whose post-load hook splices ``code_by_id[model.id]`` into the device run's run.py (the CPU
    reference stays clean), and nothing for any other model."""
    return f"""
CODE = {code_by_id!r}


def pytest_neuron_support_post_load(config, model):
    return CODE.get(model.id)
"""


def session_rows(results: Path, failed_only: bool = False) -> str:
    """The rows of a session's results folder (all of them, or those that did not pass), one line
    each with the whole error: what a failed end-to-end test shows first, so a CI log that keeps
    only the head of a long failure still says what broke."""
    data = results / "data"
    if not data.exists():
        return f"no rows in {results}"
    import pandas as pd  # what the tests that call this read rows with anyway

    df = pd.read_parquet(data)
    if failed_only:
        df = df[df.result != "PASS"]
    return "\n".join(f"{r.model_id}: {r.result} at {r.failure_stage}: {r.error}" for r in df.itertuples())


def assert_outcomes(result: Any, results: Path, **outcomes: int) -> None:
    """``pytester.RunResult.assert_outcomes(**outcomes)``, whose failure also lists the session's rows
    (model, result, stage, error) from ``results``."""
    try:
        result.assert_outcomes(**outcomes)
    except AssertionError as error:
        raise AssertionError(f"{error}\nthe session's rows:\n{session_rows(results)}") from None


def _ancestors() -> set[int]:
    """This process and its ancestors: they may carry the tag too (a finder run by a tagged
    process), but they are the ones looking, not what is looked for."""
    pids: set[int] = set()
    pid = os.getpid()
    while pid > 0 and pid not in pids:
        pids.add(pid)
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            break
        pid = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("PPid:")), 0)
    return pids


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _mentions(cwd: str, argv: list[str], root: str) -> bool:
    """True if the process runs in ``root`` or below (spawned ranks inherit run.py's cwd, the run
    directory), or one of its arguments is a path there (run.py itself, named by its path)."""
    if _within(cwd, root):
        return True
    return any("/" in arg and _within(os.path.realpath(os.path.join(cwd, arg)), root) for arg in argv)


def own_processes(tag: str, under: Path | str | None = None) -> list[Process]:
    """The live processes (zombies hold nothing, so they are left out) whose environment carries
    ``TAG_VAR=tag``, other than this process and its ancestors; with ``under``, only those whose
    cwd or a command-line path lies in that directory."""
    entry = f"{TAG_VAR}={tag}".encode()
    root = None if under is None else os.path.realpath(under)
    skip = _ancestors()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) in skip:
            continue
        try:
            # Another user's process, or one that exits while it is read, is not ours to report.
            if entry not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            status = (proc / "status").read_text()
            argv = [a.decode(errors="replace") for a in (proc / "cmdline").read_bytes().split(b"\0") if a]
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if "State:\tZ" in status:
            continue
        if root is not None and not _mentions(cwd, argv, root):
            continue
        found.append(Process(int(proc.name), cwd, " ".join(argv)))
    return sorted(found, key=lambda p: p.pid)


def survivors(tag: str, under: Path | str | None = None, grace_s: float = 5.0) -> list[Process]:
    """``own_processes``, polled for up to ``grace_s`` until none is left: a group just sent
    SIGKILL may take a moment to exit, while a real leak outlives the grace."""
    deadline = time.monotonic() + grace_s
    while True:
        found = own_processes(tag, under)
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.1)


def kill_own_processes(tag: str) -> None:
    """SIGKILL every live process carrying the tag, by pid: a failed check must not leave its
    processes running into the next test."""
    for proc in own_processes(tag):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(proc.pid, signal.SIGKILL)


# --- The process tree, recorded while it runs ------------------------------------------------
#
# A scan after the fact cannot tell "the ranks were killed" from "the scan never saw a rank": by
# the time it runs, the harness has killed the group. So every Python process a test's session
# starts (xdist workers, run.py, spawned ranks, references, compiler workers) records itself the
# moment its interpreter starts, through a sitecustomize on PYTHONPATH that the whole tree
# inherits: pid, parent, start time (so a reused pid is not mistaken for it), cwd and command
# line. Whether a recorded process is still alive is then a question about that very process.

RECORD_VAR = "NEURON_SUPPORT_TEST_RECORD"

SITECUSTOMIZE = """
import json as _json
import os as _os

def _record_self():
    where = _os.environ.get("NEURON_SUPPORT_TEST_RECORD")
    if not where:
        return
    stat = open("/proc/self/stat").read()
    fields = stat[stat.rindex(")") + 2:].split()
    argv = [a.decode(errors="replace") for a in open("/proc/self/cmdline", "rb").read().split(b"\\0") if a]
    record = {"pid": _os.getpid(), "ppid": int(fields[1]), "start": fields[19], "cwd": _os.getcwd(), "argv": argv}
    tmp = _os.path.join(where, f".{_os.getpid()}.tmp")
    with open(tmp, "w") as handle:
        _json.dump(record, handle)
    _os.replace(tmp, _os.path.join(where, f"{_os.getpid()}-{fields[19]}.json"))

try:
    _record_self()
except OSError:
    pass  # a process that cannot record itself must still run
"""


@dataclass(frozen=True)
class Recorded:
    """A process as it recorded itself when it started."""

    pid: int
    ppid: int
    start: str
    cwd: str
    argv: tuple[str, ...]

    @property
    def is_rank(self) -> bool:
        """A rank started by torch.multiprocessing spawn: its command line names only the
        spawn module, never the model or run.py."""
        return any("multiprocessing.spawn" in arg for arg in self.argv)

    def alive(self) -> bool:
        """True while this very process (same pid and start time) exists and is not a zombie."""
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except OSError:
            return False
        fields = stat[stat.rindex(")") + 2 :].split()
        return fields[19] == self.start and fields[0] != "Z"

    def under(self, root: Path | str) -> bool:
        """Runs in ``root`` or below, or names a path there (see :func:`_mentions`)."""
        return _mentions(self.cwd, list(self.argv), os.path.realpath(root))


def record_tree(directory: Path, site: str = SITECUSTOMIZE) -> dict[str, str]:
    """The environment that makes every Python process started with it record itself into
    ``directory`` (``site`` is the sitecustomize source; a test may append to it). Keeps the
    PYTHONPATH already set, after the recorder's own directory."""
    procs = directory / "procs"
    procs.mkdir(parents=True)
    (directory / "sitecustomize.py").write_text(site)
    path = os.pathsep.join(p for p in (str(directory), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, RECORD_VAR: str(procs)}


def recorded(directory: Path) -> list[Recorded]:
    """Every process that recorded itself into ``directory`` (see :func:`record_tree`)."""
    found = []
    for path in sorted((directory / "procs").glob("*.json")):
        r = json.loads(path.read_text())
        found.append(Recorded(r["pid"], r["ppid"], r["start"], r["cwd"], tuple(r["argv"])))
    return found


# A conftest for a test's pytester session: each time an item's call phase is reported (after
# the item ran, so after its harness ended its runs), it writes which recorded processes are
# alive at that moment. "Gone by the time the item reported" is the promise; a scan after the
# session would also pass if they were stopped only when the session ended.
REPORT_ALIVE = """
import json as _json
import os as _os
import sys as _sys
import uuid as _uuid

_sys.path.insert(0, {tests!r})
from faultkit import recorded as _recorded


def pytest_runtest_logreport(report):
    if report.when != "call":
        return
    record = _os.path.dirname(_os.environ["NEURON_SUPPORT_TEST_RECORD"])
    alive = [r.__dict__ | {{"argv": list(r.argv)}} for r in _recorded(__import__("pathlib").Path(record)) if r.alive()]
    reports = _os.path.join(record, "reports")
    _os.makedirs(reports, exist_ok=True)
    # Named by this process and a uuid, written to a temporary name and renamed: xdist workers report
    # at the same time into one folder, and a name counted from its listing could be taken twice.
    name = f"{{_os.getpid()}}-{{_uuid.uuid4().hex}}"
    tmp = _os.path.join(reports, f".{{name}}.tmp")
    with open(tmp, "w") as handle:
        _json.dump({{"nodeid": report.nodeid, "alive": alive}}, handle)
    _os.replace(tmp, _os.path.join(reports, f"{{name}}.json"))
"""


def report_alive_conftest() -> str:
    """:data:`REPORT_ALIVE`, importing this module from where it lies."""
    return REPORT_ALIVE.format(tests=str(Path(__file__).resolve().parent))


def alive_at_report(directory: Path, model_id: str) -> list[Recorded]:
    """The recorded processes alive when ``model_id``'s item reported (see :data:`REPORT_ALIVE`): the
    item whose node id is ``model_id`` or ends in ``[model_id]`` (``tiny-random/qwen3`` is not
    ``tiny-random/qwen3_moe``'s). Under xdist one item reports twice, on its worker and again on the
    controller: what was alive at either moment counts, so no report can hide a live process. Fails if
    the item never reported, so a missing report is not read as "none alive", and if two items match."""
    found = []
    for path in (directory / "reports").glob("*.json"):
        report = json.loads(path.read_text())
        if report["nodeid"] == model_id or report["nodeid"].endswith(f"[{model_id}]"):
            found.append(report)
    assert found, f"no report of {model_id} in {directory / 'reports'}"
    nodeids = sorted({r["nodeid"] for r in found})
    assert len(nodeids) == 1, f"{len(nodeids)} items match {model_id}: {nodeids}"
    alive = {(r["pid"], r["start"]): r for report in found for r in report["alive"]}
    return [Recorded(r["pid"], r["ppid"], r["start"], r["cwd"], tuple(r["argv"])) for r in alive.values()]
