"""The warm interpreter of the CPU side (run.forkserver) against real processes: a script started from it
is the process a fresh ``python run.py`` would be, ends as one would, and never outlives the harness."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_neuron_support.run import forkserver
from pytest_neuron_support.run.execution import ProcessOutcome, harness_env, run_script
from tests.test_execution import wait_gone

#: What a script tells of itself: everything a run's outcome could depend on, beside its parent.
SELF_REPORT = """
import json, os, sys
report = {
    "argv": sys.argv, "file": __file__, "name": __name__, "cwd": os.getcwd(), "path0": sys.path[0],
    "environ": dict(os.environ), "stdin": sys.stdin.read(), "ppid": os.getppid(),
    "own_group": os.getpgid(0) == os.getpid(), "own_session": os.getsid(0) == os.getpid(),
}
json.dump(report, open(sys.argv[2], "w"))
print("said on stdout")
print("said on stderr", file=sys.stderr)
"""


LATE_THREAD = """
import threading, time
threading.Thread(target=lambda: (time.sleep(0.5), print("late thread"))).start()
"""


#: An idle executor kept in a module global: the interpreter's thread shutdown stops its worker (a
#: join of every thread alone would wait for it forever, found in review).
KEPT_EXECUTOR = """
from concurrent.futures import ThreadPoolExecutor
POOL = ThreadPoolExecutor(1)
POOL.submit(print, "submitted").result()
"""


def write(folder: Path, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "run.py"
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return path


def run(script: Path, env: dict[str, str], *, warm: bool = True, timeout: float = 60, **kw: object) -> ProcessOutcome:
    out, log = script.parent / "result.json", script.parent / "log.txt"
    return run_script(script, out, env=env, timeout=timeout, log_path=log, warm=warm, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def warm_env() -> Iterator[dict[str, str]]:
    """An environment of its own (so no other test's server serves it) with this process's server for
    it started and ready."""
    env = {**os.environ, "NEURON_SUPPORT_FORKSERVER_TEST": uuid.uuid4().hex}
    forkserver.enable()
    server = forkserver.server_for(sys.executable, harness_env(env))
    assert server is not None and server.wait_ready(300), "the warm interpreter did not start"
    yield env
    forkserver.disable()


def server_pid(env: dict[str, str]) -> int | None:
    server = forkserver.server_for(sys.executable, harness_env(env))
    return None if server is None else server.pid


def test_a_warm_script_is_the_process_a_fresh_one_would_be(warm_env: dict[str, str], tmp_path: Path) -> None:
    warm = run(write(tmp_path / "warm", SELF_REPORT), warm_env)
    fresh = run(write(tmp_path / "fresh", SELF_REPORT), warm_env, warm=False)
    assert warm.returncode == fresh.returncode == 0
    assert warm.result is not None and fresh.result is not None
    # The warm one is a fork of the server; the fresh one a child of this process.
    assert warm.result["ppid"] == server_pid(warm_env) and fresh.result["ppid"] == os.getpid()
    mine, theirs = dict(warm.result), dict(fresh.result)
    for report, folder in ((mine, "warm"), (theirs, "fresh")):
        report.pop("ppid")
        text = json.dumps(report).replace(str(tmp_path / folder), "<folder>")
        report.clear()
        report.update(json.loads(text))
    assert mine == theirs
    assert mine["name"] == "__main__" and mine["own_group"] and mine["own_session"] and mine["stdin"] == ""
    assert mine["environ"]["NEURON_SUPPORT_HARNESS"] == "1"
    log = warm.log_path.read_text()
    assert "said on stdout" in log and "said on stderr" in log


@pytest.mark.parametrize(
    ("body", "status", "in_log"),
    [
        ("import sys; sys.exit(3)", 3, None),
        ("import sys; sys.exit('it went wrong')", 1, "it went wrong"),
        ("raise ValueError('a planted bug')", 1, "ValueError: a planted bug"),
        ("import os, signal; print('before', flush=True); os.kill(os.getpid(), signal.SIGKILL)", -9, "before"),
        (LATE_THREAD, 0, "late thread"),
        ("import atexit; atexit.register(lambda: print('at exit'))", 0, "at exit"),
        (KEPT_EXECUTOR, 0, "submitted"),
    ],
    ids=["exit-code", "exit-message", "exception", "killed", "thread-joined", "atexit", "kept-executor"],
)
def test_a_warm_script_ends_as_a_fresh_one(
    warm_env: dict[str, str], tmp_path: Path, body: str, status: int, in_log: str | None
) -> None:
    warm = run(write(tmp_path / "warm", body), warm_env)
    fresh = run(write(tmp_path / "fresh", body), warm_env, warm=False)
    assert warm.returncode == fresh.returncode == status
    if in_log is not None:
        assert in_log in warm.log_path.read_text() and in_log in fresh.log_path.read_text()


def test_a_timeout_kills_a_warm_script_and_what_it_started(warm_env: dict[str, str], tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    body = f"""
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    open({str(pidfile)!r}, "w").write(str(child.pid))
    time.sleep(300)
    """
    started = time.monotonic()
    outcome = run(write(tmp_path / "warm", body), warm_env, timeout=8)
    assert outcome.timed_out and outcome.returncode < 0
    assert time.monotonic() - started < 30
    assert wait_gone(int(pidfile.read_text()))


def test_a_cancelled_warm_script_stops_at_once(warm_env: dict[str, str], tmp_path: Path) -> None:
    cancel = threading.Event()
    threading.Timer(1.0, cancel.set).start()
    started = time.monotonic()
    outcome = run(write(tmp_path / "warm", "import time; time.sleep(300)"), warm_env, timeout=120, cancel=cancel)
    assert not outcome.timed_out and outcome.returncode < 0
    assert time.monotonic() - started < 30


def test_a_warm_script_gets_the_address_space_cap(warm_env: dict[str, str], tmp_path: Path) -> None:
    body = "import resource, sys; print(resource.getrlimit(resource.RLIMIT_AS)[0]); sys.exit(0)"
    cap = 64 * 2**30
    outcome = run(write(tmp_path / "warm", body), warm_env, memory_limit=cap)
    assert outcome.returncode == 0 and str(cap) in outcome.log_path.read_text()


def test_a_run_of_another_environment_is_never_served_by_this_one(warm_env: dict[str, str], tmp_path: Path) -> None:
    """The guard that keeps what the libraries read at import right: a server serves its own environment
    only. Planted: a run whose environment differs in one variable gets its own value, never the server's."""
    other = {**warm_env, "NEURON_SUPPORT_FORKSERVER_TEST": "another"}
    outcome = run(write(tmp_path / "other", SELF_REPORT), other)
    assert outcome.result is not None
    assert outcome.result["environ"]["NEURON_SUPPORT_FORKSERVER_TEST"] == "another"
    assert outcome.result["ppid"] != server_pid(warm_env)


def test_a_variable_that_names_the_current_test_does_not_keep_a_run_from_the_server(
    warm_env: dict[str, str], tmp_path: Path
) -> None:
    """pytest names the test it runs in PYTEST_CURRENT_TEST, which every check's processes inherit: a
    server keyed by it would serve no second check (the first main job measured with warm starts started
    every reference fresh). The script still gets its own value."""
    mine = {**warm_env, "PYTEST_CURRENT_TEST": "models.yaml::test_model[another] (call)"}
    outcome = run(write(tmp_path / "other-test", SELF_REPORT), mine)
    assert outcome.result is not None and outcome.result["ppid"] == server_pid(warm_env)
    assert outcome.result["environ"]["PYTEST_CURRENT_TEST"] == mine["PYTEST_CURRENT_TEST"]


def test_with_servers_off_every_script_is_fresh(
    warm_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(forkserver, "_enabled", False)  # as outside a session: its servers stay as they are
    outcome = run(write(tmp_path / "off", SELF_REPORT), warm_env)
    assert outcome.result is not None and outcome.result["ppid"] == os.getpid()


def test_a_server_never_forks_beside_a_thread(tmp_path: Path) -> None:
    """A fork copies only the forking thread: a lock another thread held stays held in the child forever.
    Planted: with a second thread alive, the server answers no request (the harness then runs fresh)."""
    import socket

    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    ours, theirs = socket.socketpair()
    try:
        ours.sendall(json.dumps({"script": str(tmp_path / "run.py"), "out": "x", "log": "y"}).encode() + b"\n")
        assert forkserver._fork_for(theirs, []) is None
    finally:
        stop.set()
        thread.join()
        ours.close()
        theirs.close()


def test_the_server_and_its_scripts_end_with_the_process_that_started_them(tmp_path: Path) -> None:
    """A harness killed outright (SIGKILL: nothing of it runs after) leaves nothing behind: its server sees
    its stdin close and ends, removing its socket's folder, and each script started from it ends with it
    (run.py asks the kernel)."""
    pids = tmp_path / "pids.json"
    script = write(
        tmp_path / "run",
        """
        import ctypes, signal, time
        ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # as run.py does under the harness
        time.sleep(300)
        """,
    )
    harness = f"""
    import json, os, sys, threading, time
    from pathlib import Path
    from pytest_neuron_support.run import forkserver
    from pytest_neuron_support.run.execution import harness_env, run_script
    forkserver.enable()
    env = dict(os.environ)
    server = forkserver.server_for(sys.executable, harness_env(env))
    assert server.wait_ready(300)
    script = Path({str(script)!r})
    threading.Thread(target=run_script, args=(script, script.parent / "result.json"),
                     kwargs=dict(env=env, timeout=600, log_path=script.parent / "log.txt", warm=True)).start()
    import psutil
    while not (children := psutil.Process(server.pid).children()):
        time.sleep(0.05)
    Path({str(pids)!r}).write_text(json.dumps({{"server": server.pid, "script": children[0].pid,
                                                 "socket": server.address}}))
    time.sleep(300)
    """
    process = subprocess.Popen([sys.executable, "-c", textwrap.dedent(harness)], cwd=str(Path(__file__).parents[1]))
    try:
        deadline = time.monotonic() + 300
        while not pids.exists() and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.1)
        assert pids.exists(), "the harness did not start its script from a warm interpreter"
        started = json.loads(pids.read_text())
        process.kill()
        process.wait()
        assert wait_gone(started["server"]) and wait_gone(started["script"])
        # Nor its socket or folder: the server removes them as it ends (its harness never could).
        assert not Path(started["socket"]).parent.exists()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


#: Each process of a session writes whether its CPU-side scripts start warm, once it is configured.
REPORTING_CONFTEST = """
import json, os
import pytest
from pytest_neuron_support.run import forkserver

@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    workerinput = getattr(config, "workerinput", None)  # the environment's worker id is the outer run's
    name = workerinput["workerid"] if workerinput else "controller"
    with open(os.path.join(os.environ["WARM_REPORT_DIR"], name), "w") as f:
        json.dump(forkserver._enabled, f)
"""


@pytest.mark.parametrize(("option", "workers"), [((), "warm"), (("--cpu-side-starts=fresh",), "fresh")])
def test_the_processes_that_run_checks_start_their_cpu_side_warm_unless_asked_not_to(
    pytester: pytest.Pytester, offline_hub: Path, monkeypatch: pytest.MonkeyPatch, option: tuple[str, ...], workers: str
) -> None:
    """The xdist controller runs no check: only its workers (or a session's one process) get servers."""
    reports = pytester.mkdir("reports")
    monkeypatch.setenv("WARM_REPORT_DIR", str(reports))
    pytester.makeconftest(REPORTING_CONFTEST)
    pytester.makefile(".yaml", models="models:\n  - id: tiny-random/qwen3\n    task: text-generation\n")
    for args in (("-n", "2"), ("-p", "no:xdist")):
        for report in reports.iterdir():
            report.unlink()
        # Every process configures, none runs a model (xdist starts no worker for --collect-only).
        result = pytester.runpytest_subprocess("--device=cpu", "-k", "no-such-model", "-q", *args, *option)
        assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED, result.stdout.str()
        enabled = {report.name: json.loads(report.read_text()) for report in reports.iterdir()}
        expected = workers == "warm"
        if args[0] == "-n":
            assert enabled == {"controller": False, "gw0": expected, "gw1": expected}
        else:
            assert enabled == {"controller": expected}


#: What a compiling script sees of inductor's settings as it starts: read when inductor's config was imported.
INDUCTOR_SETTINGS = """
import json, os, sys
started_with = sorted(m for m in ("torch._inductor.compile_fx", "sympy.physics.units") if m in sys.modules)
import torch._inductor.config as config
import multiprocessing.process
import torch._dynamo.config
json.dump({"cpp_wrapper": config.cpp_wrapper, "started_with": started_with,
           "debug_dir_root": torch._dynamo.config.debug_dir_root,
           "original_dir": multiprocessing.process.ORIGINAL_DIR, "parent": os.getppid()}, open(sys.argv[2], "w"))
"""


def test_a_warm_device_run_compiles_with_the_settings_its_environment_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server imported inductor's config with its own environment: a device run served by it compiles with the
    device table's settings only because its environment held them from the start (``device_run_env``). One that
    set the variable itself, as run.py's ``setdefault`` does, would compile without it: the planted case."""
    from pytest_neuron_support.run.context import device_run_env
    from tests.test_devices import settings_on

    base = {**os.environ, "NEURON_SUPPORT_FORKSERVER_TEST": uuid.uuid4().hex}
    base.pop("TORCHINDUCTOR_CPP_WRAPPER", None)
    device_env = device_run_env(settings_on("cpu"), base, {}, 1)
    # A registry of this test's own: the servers other tests of this process keep count against MAX_SERVERS.
    servers: dict[object, forkserver.ForkServer] = {}
    monkeypatch.setattr(forkserver, "_servers", servers)
    monkeypatch.setattr(forkserver, "_enabled", True)
    try:
        server = forkserver.server_for(sys.executable, harness_env(device_env))
        assert server is not None and server.wait_ready(300), "the warm interpreter did not start"
        # A run that compiles nothing (the CPU side's) starts before the compiler is imported: a server that only
        # ever serves those never imports it.
        run(write(tmp_path / "cpu-side", INDUCTOR_SETTINGS), device_env)
        cpu_side = json.loads((tmp_path / "cpu-side" / "result.json").read_text())
        assert (cpu_side["started_with"], cpu_side["parent"]) == ([], server.pid)
        outcome = run(write(tmp_path / "device", INDUCTOR_SETTINGS), device_env, compiles=True)
        said = json.loads((tmp_path / "device" / "result.json").read_text())
        assert outcome.returncode == 0
        # Served warm (a fork of that server, which imported what a first compile imports before it) and with the
        # setting; what torch and multiprocessing derived from the working directory at import is the run's
        # folder, as for a fresh run.py (compile debug output and a compile error's minifier go there, not the
        # server's).
        folder = str(tmp_path / "device")
        assert said == {
            "cpp_wrapper": True,
            "started_with": ["sympy.physics.units", "torch._inductor.compile_fx"],
            "debug_dir_root": os.path.join(folder, "torch_compile_debug"),
            "original_dir": folder,
            "parent": server.pid,
        }
        # The server imported them itself, once: a run forked after it finds them, and forks still work.
        run(write(tmp_path / "after", INDUCTOR_SETTINGS), device_env)
        after = json.loads((tmp_path / "after" / "result.json").read_text())
        assert (after["started_with"], after["parent"]) == (said["started_with"], server.pid)

        importing = "import torch._inductor.config as config"
        setting_itself = INDUCTOR_SETTINGS.replace(
            importing, f"import os\nos.environ.setdefault('TORCHINDUCTOR_CPP_WRAPPER', '1')\n{importing}"
        )
        late_server = forkserver.server_for(sys.executable, harness_env(base))
        assert late_server is not None and late_server.wait_ready(300), "the warm interpreter did not start"
        run(write(tmp_path / "late", setting_itself), base, compiles=True)
        late = json.loads((tmp_path / "late" / "result.json").read_text())
        assert late["parent"] == late_server.pid and late["started_with"]
        assert late["cpp_wrapper"] is False, "served warm, the late variable is not read"
        run(write(tmp_path / "fresh", setting_itself), base, warm=False)
        assert json.loads((tmp_path / "fresh" / "result.json").read_text())["cpp_wrapper"] is True
    finally:
        for each in servers.values():
            each.close()
    # The servers' folders went with them (nothing of a run is left in them).
    assert not any(Path(each.address).parent.exists() for each in servers.values())


#: Records which of a session's scripts started warm: each run's folder, whether it compiles, the pid of the server
#: that took it (None: it started fresh).
SPAWN_RECORDING_CONFTEST = """
import json, os
from pytest_neuron_support.run import forkserver

forkserver.READY_WAIT_S = 600  # two servers importing at once beside the rest of the suite: never fall back for time
_spawn = forkserver.spawn

def _recorded(python, env, script, out, log_path, memory_limit, compiles=False):
    process = _spawn(python, env, script, out, log_path, memory_limit, compiles)
    server = forkserver.server_for(python, env) if process is not None else None
    with open(os.environ["SPAWN_RECORD"], "a") as f:
        f.write(json.dumps([script.parent.name, compiles, None if server is None else server.pid]) + "\\n")
    return process

forkserver.spawn = _recorded
"""


@pytest.mark.slow
def test_a_cpu_session_starts_its_one_rank_device_runs_warm(
    pytester: pytest.Pytester, offline_hub: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As README's main job runs: the tiny qwen3 on the cpu device, its device run and its CPU side both started
    from the one server of the process (the two sides' environments are one: ``context.cpu_env``), and the row
    a PASS."""
    record = pytester.path / "spawned.jsonl"
    monkeypatch.setenv("SPAWN_RECORD", str(record))
    pytester.makeconftest(SPAWN_RECORDING_CONFTEST)
    pytester.makefile(".yaml", models="models:\n  - id: tiny-random/qwen3\n    task: text-generation\n")
    result = pytester.runpytest_subprocess(
        "--device=cpu", "--models-file=models.yaml", "-p", "no:xdist", "--reference-cache=none", "-q"
    )
    assert result.ret == 0, result.stdout.str()
    lines = map(json.loads, record.read_text().splitlines())
    spawned = {folder: (compiles, server) for folder, compiles, server in lines}
    assert spawned["device"][0] is True and spawned["reference"][0] is False, spawned
    servers = {server for _, server in spawned.values()}
    assert len(servers) == 1 and None not in servers, spawned


def test_a_leases_core_slice_does_not_keep_a_run_from_the_server() -> None:
    # The neuron_cores fixture's runs carry their lease's slice; keyed by it, every lease would start a server.
    from pytest_neuron_support.run.cores import SLICE_ENV

    assert SLICE_ENV in forkserver.PER_RUN
