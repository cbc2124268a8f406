"""Running a rendered check script: in a session of its own, under a deadline, its result read back.

A script writes its ``check()`` dict (or the exception it raised) as JSON to the path it is given
(scripts/harness.py ``main()``); its stdout and stderr go to a log beside it. When it ends, or at the
deadline, the whole process group goes (the script and what it spawned: ranks, compiler workers), so
no check leaves anything holding a device core.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Outcome:
    """How one check script ended.

    Attributes:
        result: what it wrote (its check() dict, or ``error``/``traceback``), or None if it wrote nothing.
        returncode: its exit status (negative: the signal that ended it).
        timed_out: the doctor killed its process group at the timeout.
        log: the tail of its combined stdout and stderr.
    """

    result: Mapping[str, Any] | None
    returncode: int
    timed_out: bool
    log: str

    @property
    def error(self) -> str | None:
        """The failure in words, or None when check() returned normally."""
        if self.result is not None and "error" not in self.result:
            return None
        if self.result is not None:
            return str(self.result["error"])
        if self.timed_out:
            return f"timed out; log: {tail(self.log)}"
        return f"exit {self.returncode} without a result; log: {tail(self.log)}"

    def get(self, name: str, default: Any = None) -> Any:
        return default if self.result is None else self.result.get(name, default)


def tail(text: str, chars: int = 1500) -> str:
    """The end of a log or an error output, its non-empty lines on one line (a table cell)."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines)[-chars:] or "(empty)"


def kill_group(pgid: int) -> None:
    """TERM the group (the script and what it spawned: ranks, compiler workers), then KILL what is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        except PermissionError:
            break
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


class Running:
    """A started check script (its own session, so a timeout ends everything it started)."""

    def __init__(self, script: Path, out: Path, log: Path, env: Mapping[str, str], python: str) -> None:
        self.out, self.log = out, log
        with contextlib.suppress(FileNotFoundError):
            out.unlink()
        with open(log, "wb") as handle:
            self.proc = subprocess.Popen(
                [python, str(script), str(out)],
                cwd=str(script.parent),
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, deadline: float) -> Outcome:
        """Wait for the script until ``deadline`` (``time.monotonic()``), then end its group and read it."""
        timed_out = False
        try:
            returncode = self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_group(self.proc.pid)
            returncode = self.proc.wait()
        except BaseException:
            kill_group(self.proc.pid)
            self.proc.wait()
            raise
        kill_group(self.proc.pid)  # whatever it left behind (a rank, a compiler worker) goes too
        result: Mapping[str, Any] | None = None
        with contextlib.suppress(OSError, ValueError):
            result = json.loads(self.out.read_text(encoding="utf-8"))
        log = self.log.read_text(encoding="utf-8", errors="replace") if self.log.exists() else ""
        return Outcome(result=result, returncode=returncode, timed_out=timed_out, log=log)
