"""Shared by the fault-family test modules: a catalog of tiny-zoo models, and a finder for the
processes a test started.

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
