"""A warm interpreter that starts the CPU side's scripts and the cpu device's one-rank runs: torch and
transformers imported once, each script a fork of it.

Why: a CPU-side run of a tiny model (the reference, the teacher-forced check, the judge) is nearly all
interpreter start. Measured on the project's 2-CPU machines: a tiny qwen3 reference run.py costs about
5 CPU-s, of which importing torch, transformers and what ``from_pretrained`` pulls in is about 4;
README's main job starts 37 of them and its device runs beside them keep both CPUs busy throughout, so
every one of those seconds is half a second of the job.

What a script started here shares with ``python run.py --out result.json`` (``execution.run_script``):
a process of its own in a session of its own (its process group is its pid, so the harness kills it and
whatever it started as before), its folder as the working directory, its environment exactly (and a
server only serves runs whose environment is the one it was started with, but for :data:`PER_RUN`
variables no library reads at import, so what the libraries read at import is what a fresh process would
read), ``sys.argv``, ``__file__``, ``sys.path[0]``, ``__name__ == "__main__"``, stdout and stderr into
its log, stdin from ``/dev/null``, the address-space cap, its exit status (a signal's death included,
negative as Popen gives it), and ending with its parent (run.py asks for that itself). What differs: the
modules the server imported are already imported, so a warning the libraries print once at import is not
in the run's log; and Python's hash seed is the server's.

What starts here (``run_script(..., warm=True)``): the CPU side's scripts, and device runs of one rank
where the device table allows it (``DeviceKind.warm_runs``: cpu). A compile reads the compiler's
settings from the environment when inductor's config is first imported, which the server has done: so
a device run's environment holds the device table's variables before it starts
(``context.device_run_env``) instead of run.py setting them, and the server that serves it, started with
that very environment, read what the run's own import would have read. On the cpu device the CPU side's
environment holds those variables too (``context.cpu_env``), so one server a process serves both sides.
On neuron and cuda every device run is a fresh process (on neuron it must be: ``import torch`` loads
torch-neuronx, whose runtime a fork cannot share), and so is every rank of a sharded run. A run the server
cannot take (a third environment, a server that did not start within :data:`READY_WAIT_S`, any error before the script
started) runs as a fresh process instead. The session turns it on (:func:`enable`) in each process that
runs checks and off at its end (:func:`disable`). The first run of an environment starts its server and
waits for its import, the import it would otherwise have done itself, so a process that starts one
CPU-side script pays about what it did, and every later one saves its import.

Run as ``python -m pytest_neuron_support.run.forkserver SOCKET``: serves until its stdin closes, which
its parent's end does.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_neuron_support.run.cores import SLICE_ENV

#: What the server imports before it says it is ready: what every CPU-side script imports first
#: (run.py's and judge.py's imports, and what ``from_pretrained`` imports for any model).
WARM_IMPORTS = (
    "torch",
    "transformers",
    "transformers.modeling_utils",
    "transformers.masking_utils",
    "transformers.activations",
    "transformers.generation",
    "transformers.models.auto.modeling_auto",
    "transformers.models.auto.tokenization_auto",
)

#: What a server imports besides (:data:`WARM_IMPORTS`) before it forks its first run that compiles: what a
#: device run's first compile imports. Measured with ``python -X importtime`` on a one-rank cpu run of the
#: tiny qwen3, about 1.2 CPU-s: inductor's code generation and lowering, and sympy's units, which
#: ``sympy.simplify`` imports at its first call (inductor's index arithmetic makes it). A server that only
#: ever starts the CPU side's scripts, which compile nothing, never imports them.
COMPILE_IMPORTS = ("torch._inductor.compile_fx", "sympy.physics.units")

#: Servers one process keeps at most, one per environment its runs have: on the cpu device a session's CPU
#: side and its one-rank device runs share one (``context.cpu_env``); a second serves a run whose
#: environment differs (a user's own ``TORCH_DEVICE_BACKEND_AUTOLOAD`` beside the CPU side's 0).
MAX_SERVERS = 2

#: How long a run waits for its server to finish importing, the first run of a process's included (its
#: import is what a fresh process would spend itself): past it, the run starts fresh.
READY_WAIT_S = 120.0

#: How long a request waits for the server to answer with the new process's pid.
_ANSWER_S = 30.0

_READY = "ready"

#: Variables that differ from one run to the next and that no library reads at import: a server started
#: with one value serves runs with any other (each script gets its own environment, exactly). pytest
#: names the test it runs in ``PYTEST_CURRENT_TEST``, which every check's processes inherit; a lease's
#: slice of the host's cores (:data:`~.cores.SLICE_ENV`, which the ``neuron_cores`` fixture's runs carry) is
#: read only by a pytest session started inside the run.
PER_RUN = frozenset({"PYTEST_CURRENT_TEST", SLICE_ENV})

#: Modules whose settings hold paths derived from the working directory when they were imported (torch's
#: compile configs: ``debug_dir_root``, where ``TORCH_COMPILE_DEBUG`` writes and a compile error's
#: minifier points). A fresh run.py derives them from its own folder, so a child re-derives them.
_CWD_CONFIGS = ("torch._dynamo.config", "torch._inductor.config", "torch._functorch.config")


def read_at_import(env: Mapping[str, str]) -> frozenset[tuple[str, str]]:
    """What of ``env`` a server must share with a run it serves: all of it but :data:`PER_RUN`."""
    return frozenset((k, v) for k, v in env.items() if k not in PER_RUN)


# --- The server ---------------------------------------------------------------------------------


def _exit_code(code: Any) -> int:
    """The status ``sys.exit(code)`` gives a process (None: 0; an int: itself; anything else: printed, 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _move_working_directory(old: str, new: str) -> None:
    """Change to ``new``, and move what the imported libraries derived from ``old``, the server's folder,
    to it: multiprocessing's ``ORIGINAL_DIR`` and the paths of :data:`_CWD_CONFIGS` under ``old``."""
    os.chdir(new)
    process = sys.modules.get("multiprocessing.process")
    if process is not None and getattr(process, "ORIGINAL_DIR", None) == old:
        process.ORIGINAL_DIR = new  # type: ignore[attr-defined]
    for name in _CWD_CONFIGS:
        config = sys.modules.get(name)
        if config is None:
            continue
        for key, value in config.get_config_copy().items():
            if isinstance(value, str) and (value == old or value.startswith(old + os.sep)):
                setattr(config, key, new + value[len(old) :])


def _child(request: Mapping[str, Any], inherited: list[Any], started: int) -> None:
    """In the forked process: become ``python script --out out`` and never return (``inherited``: the
    server's sockets and selector, closed first; ``started``: written once the child leads its own
    process group)."""
    code = 1
    try:
        for each in inherited:
            each.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        os.write(started, b"s")  # the server answers with the pid only now: a kill of the group finds it
        os.close(started)
        if request.get("memory_limit") is not None:
            import resource

            limit = int(request["memory_limit"])
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        script = Path(request["script"])
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(devnull)
        _move_working_directory(os.getcwd(), str(script.parent))
        # The run's own environment, exactly: the server's differs at most in PER_RUN, and importing
        # set variables of its own (inductor writes its cache folder into TORCHINDUCTOR_CACHE_DIR).
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = [str(script), "--out", str(request["out"])]
        sys.path[0] = str(script.parent)
        # A fresh interpreter seeds these from the OS; every fork would otherwise share the server's.
        import random

        random.seed()
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        if "torch" in sys.modules:
            sys.modules["torch"].seed()
        import runpy

        try:
            runpy.run_path(str(script), run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc.code)
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
        # What the interpreter does at its end: its thread shutdown (the hooks registered with it first,
        # such as concurrent.futures' that stops idle executor workers, then the join of every
        # non-daemon thread: joining them alone would wait forever on a kept executor), then the atexit
        # functions; the finally below flushes what it printed.
        threading._shutdown()  # type: ignore[attr-defined]
        import atexit

        atexit._run_exitfuncs()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def serve(address: str) -> None:
    """Import :data:`WARM_IMPORTS`, say ready on stdout, then fork a process per request on ``address`` (a
    Unix socket) until stdin closes: its parent closes it, or dies (a pipe closes with the last process
    holding it, SIGKILL or not), and its scripts then end with it (run.py asks the kernel for that). One
    thread only: a process that forks must have no other."""
    _import(WARM_IMPORTS)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    try:
        _serve(listener)
    finally:
        # Its socket and folder go with it, however its parent ended (a SIGKILLed one never closes it).
        with contextlib.suppress(OSError):
            os.unlink(address)
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(address))


def _serve(listener: socket.socket) -> None:
    """:func:`serve`'s loop on ``listener``, bound: returns when stdin closes."""
    listener.listen(16)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "listener")
    selector.register(sys.stdin, selectors.EVENT_READ, "stdin")
    children: dict[int, socket.socket] = {}
    print(_READY, flush=True)
    while True:
        for key, _ in selector.select(timeout=0.05):
            if key.data == "stdin":
                if not sys.stdin.readline():
                    return
            else:
                connection, _ = listener.accept()
                pid = _fork_for(connection, [listener, selector, *children.values()])
                if pid is None:
                    connection.close()
                else:
                    children[pid] = connection
        # Reap the ended ones and tell each its status (Popen's: a signal's death is negative).
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            ended = children.pop(pid, None)
            if ended is not None:
                with contextlib.suppress(OSError):
                    ended.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
                ended.close()


def _import(names: tuple[str, ...]) -> None:
    import importlib

    for name in names:
        importlib.import_module(name)


def _fork_for(connection: socket.socket, inherited: list[Any]) -> int | None:
    """Read one request from ``connection``, fork its process and answer with its pid. Before the first run
    that compiles, the server imports :data:`COMPILE_IMPORTS` itself: once, for every such run after it."""
    connection.settimeout(_ANSWER_S)
    try:
        with connection.makefile("r", encoding="utf-8") as reader:
            request = json.loads(reader.readline())
    except (OSError, ValueError):
        return None
    if request.get("compiles"):
        # One that fails is the run's to import, and to fail at with its own traceback.
        with contextlib.suppress(Exception):
            _import(COMPILE_IMPORTS)
    # Never fork beside another Python thread: a lock it held would stay held in the child forever. The
    # native threads importing torch starts (its OpenMP pool, where OMP_NUM_THREADS > 1) are torch's
    # own, which it rebuilds in a forked child, as its DataLoader's forked workers rely on.
    if threading.active_count() != 1:
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:  # the child never returns into the server's loop (nor its cleanup), whatever happens
            os.close(read_end)
            _child(request, [*inherited, connection], write_end)
        finally:
            os._exit(1)
    os.close(write_end)
    os.read(read_end, 1)  # its setsid() done (or the child already gone: an empty read)
    os.close(read_end)
    try:
        connection.sendall(f"{pid}\n".encode())
    except OSError:  # the harness gave up on the answer and runs the script fresh: this one must not run
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    return pid


# --- The client ---------------------------------------------------------------------------------


class WarmProcess:
    """A script the server started: its ``pid`` (also its process group) and its end (:meth:`wait`)."""

    def __init__(self, pid: int, connection: socket.socket) -> None:
        self.pid = pid
        self._connection = connection
        self._buffer = b""
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        """Its exit status, as ``subprocess.Popen.wait`` gives it (``TimeoutExpired`` after ``timeout``).
        If the server is gone before it said, the process is killed (it would be ended with its parent
        anyway) and the status is SIGKILL's."""
        if self.returncode is not None:
            return self.returncode
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = None if deadline is None else deadline - time.monotonic()
            self._connection.settimeout(None if left is None else max(left, 0.001))
            try:
                data = self._connection.recv(64)
            except TimeoutError:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0) from None
            except OSError:
                data = b""
            if not data:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.pid, signal.SIGKILL)
                self._buffer = f"{-signal.SIGKILL}\n".encode()
                break
            self._buffer += data
        self.returncode = int(self._buffer.split(b"\n", 1)[0])
        self._connection.close()
        return self.returncode


class ForkServer:
    """One warm interpreter with the environment ``env``, started by :meth:`start`."""

    def __init__(self, python: str, env: Mapping[str, str]) -> None:
        self.python = python
        self.env = dict(env)
        self._folder = Path(tempfile.mkdtemp(prefix="neuron-support-warm-"))
        self.address = str(self._folder / "socket")
        self._process: subprocess.Popen[bytes] | None = None
        self._said = b""
        self._ready = False
        self._failed = False
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the server (it imports for a few seconds; :meth:`ready` says when it listens), with the
        environment ``env``; each script it starts gets its own."""
        self._process = subprocess.Popen(
            [self.python, "-m", "pytest_neuron_support.run.forkserver", self.address],
            cwd=str(self._folder),
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def ready(self) -> bool:
        """True once the server has imported everything and listens (never blocks)."""
        with self._lock:
            if self._ready:
                return True
            process = self._process
            if process is None or process.poll() is not None:
                return False
            fd = process.stdout.fileno()  # type: ignore[union-attr]
            try:
                while select.select([fd], [], [], 0)[0]:
                    data = os.read(fd, 64)
                    if not data:
                        return False
                    self._said += data
            except (OSError, ValueError):
                return False
            self._ready = self._said.startswith(f"{_READY}\n".encode())
            return self._ready

    def wait_ready(self, timeout: float) -> bool:
        """:meth:`ready`, waiting at most ``timeout`` seconds for it. A server that does not get ready in
        time is given up for good: later runs do not wait for it again, they run fresh."""
        deadline = time.monotonic() + timeout
        while not self.ready():
            process = self._process
            if self._failed or process is None or process.poll() is not None:
                return False
            if time.monotonic() >= deadline:
                self._failed = True
                return False
            time.sleep(0.05)
        return True

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def spawn(
        self,
        script: Path,
        out: Path,
        log_path: Path,
        memory_limit: int | None,
        env: Mapping[str, str],
        compiles: bool = False,
    ) -> WarmProcess | None:
        """Start ``script`` in a fork of the server, with ``env`` (the server's but :data:`PER_RUN`); None
        if the server cannot. ``compiles``: the script compiles (the server imports :data:`COMPILE_IMPORTS`
        first, where it has not yet)."""
        if not self.wait_ready(READY_WAIT_S):
            return None
        if read_at_import(env) != read_at_import(self.env):
            return None
        request = {  # absolute: the server's working directory is its own
            "script": str(script.absolute()),
            "out": str(out.absolute()),
            "log": str(log_path.absolute()),
            "memory_limit": memory_limit,
            "env": dict(env),
            "compiles": compiles,
        }
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            connection.settimeout(_ANSWER_S)
            connection.connect(self.address)
            connection.sendall((json.dumps(request) + "\n").encode())
            # A run that compiles may wait for the server's import of the compiler first, which is as much a
            # part of its being ready as its first import (a run given up on meanwhile would start twice).
            connection.settimeout(READY_WAIT_S if compiles else _ANSWER_S)
            answer = b""
            while not answer.endswith(b"\n"):
                data = connection.recv(64)
                if not data:
                    raise OSError("the server closed the connection")
                answer += data
            return WarmProcess(int(answer), connection)
        except (OSError, ValueError):
            connection.close()
            return None

    def close(self) -> None:
        with self._lock:  # never while ready() reads its output
            process, self._process = self._process, None
        if process is not None:
            with contextlib.suppress(OSError):
                process.stdin.close()  # type: ignore[union-attr]
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            with contextlib.suppress(OSError):
                process.stdout.close()  # type: ignore[union-attr]
        with contextlib.suppress(OSError):
            os.unlink(self.address)
        with contextlib.suppress(OSError):
            self._folder.rmdir()


# --- This process's servers ----------------------------------------------------------------------

_servers: dict[tuple[str, frozenset[tuple[str, str]]], ForkServer] = {}
_enabled = False
_registry_lock = threading.Lock()


def enable() -> None:
    """Let this process's CPU-side runs and cpu device runs of one rank start from warm servers (the
    session's checks do)."""
    global _enabled
    _enabled = True


def disable() -> None:
    """Stop this process's servers (the session ends)."""
    global _enabled
    with _registry_lock:
        _enabled = False
        servers = list(_servers.values())
        _servers.clear()
    for server in servers:
        server.close()


def server_for(python: str, env: Mapping[str, str]) -> ForkServer | None:
    """This process's server for ``python`` and ``env`` (but :data:`PER_RUN`), started by the first call that
    asks for it; None while servers are off or :data:`MAX_SERVERS` serve others."""
    key = (python, read_at_import(env))
    with _registry_lock:
        if not _enabled:
            return None
        server = _servers.get(key)
        if server is None and len(_servers) < MAX_SERVERS:
            server = _servers[key] = ForkServer(python, env)
            server.start()
        return server


def spawn(
    python: str,
    env: Mapping[str, str],
    script: Path,
    out: Path,
    log_path: Path,
    memory_limit: int | None,
    compiles: bool = False,
) -> WarmProcess | None:
    """``script`` started by this process's server for ``env`` (the first call for it starts one and waits
    for its import, which a fresh process would spend itself; ``compiles``: the script compiles); None where
    servers are off, or the server could not start it."""
    server = server_for(python, env)
    return None if server is None else server.spawn(script, out, log_path, memory_limit, env, compiles)


if __name__ == "__main__":
    serve(sys.argv[1])
