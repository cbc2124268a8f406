"""Run a rendered run.py in a process of its own (fresh, or a fork of a warm interpreter: ``run.forkserver``),
and say what happened to it (:func:`failure_of`).

Each run gets its own session (process group), so a timeout kills the script and anything
it started (compiler workers, torch.distributed ranks): leaked children would keep device
cores reserved. A child killed by a signal cannot report itself, so the parent classifies
it, using the last stage marker the script printed. What it leaves behind (its log, its result
and its ranks') has every token of its environment masked before anything reads it.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_neuron_support.base.redaction import scrub_files
from pytest_neuron_support.run import forkserver

_STAGE_MARKER = re.compile(r"^\[neuron-support\] stage=(\w+)$", re.MULTILINE)


def last_stage(log_text: str) -> str:
    """The last stage marker a run.py printed to its log ("start" if none yet)."""
    stages = _STAGE_MARKER.findall(log_text)
    return str(stages[-1]) if stages else "start"


_KILL_GRACE_S = 5.0


@dataclass(frozen=True)
class ProcessOutcome:
    """How one run.py process ended.

    Attributes:
        returncode: exit status; negative is the signal that killed it (Popen convention).
        timed_out: the harness killed its process group at the timeout.
        wall_s: seconds from start to exit.
        result: the script's JSON result, or None if it wrote none (killed, crashed).
        last_stage: the last stage marker it printed ("start" if none).
        log_path: its combined stdout/stderr.
    """

    returncode: int
    timed_out: bool
    wall_s: float
    result: Mapping[str, Any] | None
    last_stage: str
    log_path: Path

    @property
    def signal_name(self) -> str | None:
        if self.returncode >= 0:
            return None
        try:
            return signal.Signals(-self.returncode).name
        except ValueError:
            return f"signal {-self.returncode}"

    def log_tail(self, chars: int = 4000) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return text[-chars:]


def _kill_group(pgid: int) -> None:
    """SIGTERM the whole group, then SIGKILL whatever is left after a grace period."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + _KILL_GRACE_S
    while time.monotonic() < deadline:
        if not group_alive(pgid):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def end_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux ``PR_SET_PDEATHSIG``;
    elsewhere nothing happens). An xdist worker calls it, so a controller killed outright takes its
    workers along, and with them (run.py does the same) every run and rank holding device cores."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # already orphaned before the kernel was asked
        os.kill(os.getpid(), signal.SIGKILL)


def _address_space_limit(nbytes: int) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (nbytes, nbytes))

    return apply


def group_alive(pgid: int) -> bool:
    """True while any process of group ``pgid`` exists (zombies included)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait(
    proc: subprocess.Popen[bytes] | forkserver.WarmProcess, timeout: float, cancel: threading.Event | None
) -> int:
    """``proc.wait(timeout)``, also giving up (TimeoutExpired) as soon as ``cancel`` is set."""
    if cancel is None:
        return proc.wait(timeout=timeout)
    deadline = time.monotonic() + timeout
    while True:
        try:
            return proc.wait(timeout=max(0.0, min(0.2, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            if cancel.is_set() or time.monotonic() >= deadline:
                raise


def harness_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment :func:`run_script` gives a script: ``env``, and the variable that has run.py ask
    the kernel to end it (and its ranks) with the process that started it."""
    return {**env, "NEURON_SUPPORT_HARNESS": "1"}


def run_script(
    script: Path,
    out: Path,
    *,
    env: Mapping[str, str],
    timeout: float,
    log_path: Path,
    python: str = sys.executable,
    memory_limit: int | None = None,
    cancel: threading.Event | None = None,
    warm: bool = False,
    compiles: bool = False,
) -> ProcessOutcome:
    """Run ``python script --out out`` in a new session and wait at most ``timeout`` seconds.

    ``memory_limit`` caps the child's address space (bytes): a model that would exhaust the
    host fails alone, with a MemoryError row, instead of inviting the kernel's OOM killer.
    Setting ``cancel`` (from another thread) kills the process group early, like a timeout
    that is not the script's fault (``timed_out`` stays False). ``warm``: the script may start
    as a fork of a warm interpreter (``run.forkserver``, where the session turned it on: the CPU side's
    scripts, the cpu device's runs of one rank), the same process in every way a run's outcome reads;
    ``compiles``: the script compiles (its server imports the compiler before it starts it).
    """
    limit = None if memory_limit is None else _address_space_limit(memory_limit)
    with contextlib.suppress(FileNotFoundError):
        out.unlink()
    env = harness_env(env)
    start = time.monotonic()
    with open(log_path, "wb") as log:
        proc: subprocess.Popen[bytes] | forkserver.WarmProcess | None = None
        if warm:
            proc = forkserver.spawn(python, env, script, out, log_path, memory_limit, compiles)
        if proc is None:
            proc = subprocess.Popen(
                [python, str(script), "--out", str(out)],
                cwd=str(script.parent),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: killable as a whole
                preexec_fn=limit,
            )
        timed_out = False
        try:
            returncode = _wait(proc, timeout, cancel)
        except subprocess.TimeoutExpired:
            timed_out = cancel is None or not cancel.is_set()
            _kill_group(proc.pid)
            returncode = proc.wait()
        except BaseException:
            # Interrupted (Ctrl-C, pytest teardown): never leave the group running.
            _kill_group(proc.pid)
            proc.wait()
            raise
        # The script is gone; anything it started and left behind goes too.
        if group_alive(proc.pid):
            _kill_group(proc.pid)
    wall_s = time.monotonic() - start
    # The script had the tokens in its environment (downloads need them), so its own output (a
    # print in a post-load hook, a traceback quoting a URL) can hold one. Mask them in the files
    # now, the group being gone: the rows, the terminal and a published results directory are all
    # read from these files. Ranks write ``<out>.rank<i>``. This process's own tokens too, in case
    # a caller gave the script an environment without them that it found anyway.
    ranks = out.parent.glob(f"{glob.escape(out.name)}.rank*")
    scrub_files([log_path, out, *ranks], env, os.environ)
    result: Mapping[str, Any] | None = None
    if out.exists():
        try:
            result = json.loads(out.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            result = None
    log_text = log_path.read_text(encoding="utf-8", errors="replace")
    return ProcessOutcome(
        returncode=returncode,
        timed_out=timed_out,
        wall_s=wall_s,
        result=result,
        last_stage=last_stage(log_text),
        log_path=log_path,
    )


# --- What a run that did not finish means for its row -------------------------------------------

#: What the libraries say of a file that is neither in the cache nor may be downloaded
#: (transformers' OSError, huggingface_hub's LocalEntryNotFoundError and OfflineModeIsEnabled).
_NOT_CACHED = re.compile(
    r"couldn't find them in the cached files|outgoing traffic has been disabled|offline mode is enabled"
    r"|LocalEntryNotFoundError|OfflineModeIsEnabled",
    re.IGNORECASE,
)


def offline_cause(reason: str) -> str:
    """Why a run was offline, in one line: the session found the Hub unreachable (``reason``)."""
    return f"the run was offline (HF_HUB_OFFLINE=1): the Hub was found unreachable at session start: {reason}"


def offline_load_error(error: str, reason: str, checkpoint: str) -> str:
    """The error of a load that failed in a run made offline because the session found the Hub
    unreachable (``reason``): one short line when ``checkpoint`` is not in the local cache (the
    library's advice to check the connection says nothing new), else the error and why it ran offline."""
    if _NOT_CACHED.search(error):
        kind = error.split(":", 1)[0]
        return f"{kind}: {checkpoint} is not in the local cache, and {offline_cause(reason)}"
    return f"{error}\n({offline_cause(reason)})"


def failure_of(
    outcome: ProcessOutcome, what: str, *, offline: str | None = None, checkpoint: str = "the checkpoint"
) -> tuple[str, str, str]:
    """(result, failure_stage, error) for a run.py that did not succeed.

    ``offline``: why the session found the Hub unreachable (its runs were offline), None when it
    did not; a load failure of ``checkpoint`` then says so (:func:`offline_load_error`).
    """
    result = outcome.result
    if outcome.timed_out:
        return "TIMEOUT", outcome.last_stage, f"{what} exceeded the timeout after {outcome.wall_s:.0f}s"
    if result is not None and not result.get("ok"):
        stage = str(result.get("stage") or outcome.last_stage)
        error = f"{result.get('error_type')}: {result.get('error')}"
        if result.get("error_type") == "RankDied":
            # A rank that died wrote no result: its last words are only in the shared log.
            error = f"{error}\n{outcome.log_tail(1500)}".rstrip()
        if offline is not None and stage in ("start", "load"):
            error = offline_load_error(error, offline, checkpoint)
        return "ERROR", stage, error
    if outcome.signal_name is not None:
        hint = " (host out of memory?)" if outcome.signal_name == "SIGKILL" else ""
        tail = outcome.log_tail(1500)
        return "ERROR", outcome.last_stage, f"{what} killed by {outcome.signal_name}{hint}\n{tail}".rstrip()
    tail = outcome.log_tail(1500)
    return (
        "ERROR",
        outcome.last_stage,
        f"{what} exited with status {outcome.returncode} without a result\n{tail}".rstrip(),
    )


def stage_name(stage: str, reference: bool) -> str:
    if reference:
        return "reference"
    return stage if stage in ("load", "compile", "generate") else "load" if stage == "start" else stage
