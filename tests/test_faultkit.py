"""faultkit.own_processes against real processes: it finds everything a test started, by the tag
in their environment (grandchildren in sessions of their own, orphans, multiprocessing-spawned
ranks), and nothing else (an untagged twin, zombies, the test itself), so the fault tests'
"nothing is left running" checks can fail, and only for the test's own processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from faultkit import (
    TAG_VAR,
    alive_at_report,
    assert_outcomes,
    own_processes,
    record_tree,
    recorded,
    report_alive_conftest,
    session_rows,
    survivors,
)

from pytest_neuron_support.run.execution import run_script

TESTS = Path(__file__).resolve().parent

# Starts a grandchild in a session of its own, as run_script starts run.py, and says its pid.
GRANDCHILD = textwrap.dedent(
    """
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    print(child.pid, flush=True)
    if sys.argv[1] == "stay":
        time.sleep(60)
    """
)

# Starts a rank as torch.multiprocessing.spawn does (spawn start method) and says its pid.
SPAWN = textwrap.dedent(
    """
    import multiprocessing, time
    if __name__ == "__main__":
        rank = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(60,))
        rank.start()
        print(rank.pid, flush=True)
        rank.join()
    """
)


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    """The processes a test starts directly: killed and reaped after it, whatever happened."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def start(started: list[subprocess.Popen[str]], code: str, *args: str, **kwargs: object) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True, **kwargs)
    started.append(proc)
    return proc


def pids(procs: list) -> set[int]:
    return {p.pid for p in procs}


def parent(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("PPid:"))


def wait_for(tag: str, pid: int, under: Path | None = None) -> list:
    """own_processes once ``pid`` shows up in it: a spawned process execs after start() returns."""
    deadline = time.monotonic() + 30
    while pid not in pids(found := own_processes(tag, under)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def test_a_tagged_child_and_its_grandchild_in_its_own_session_are_found_and_an_untagged_twin_is_not(
    tmp_path: Path, process_tag: str, started: list
) -> None:
    run_dir = tmp_path / "out" / "runs" / "tiny-random--mistral"
    run_dir.mkdir(parents=True)
    child = start(started, GRANDCHILD, "stay", str(run_dir), cwd=run_dir)
    grandchild = int(child.stdout.readline())
    # Same command line and cwd, but another test's (or no test's) process: no tag.
    untagged_env = {k: v for k, v in os.environ.items() if k != TAG_VAR}
    twin = start(started, GRANDCHILD, "stay", str(run_dir), cwd=run_dir, env=untagged_env)
    twin_grandchild = int(twin.stdout.readline())
    try:
        assert pids(wait_for(process_tag, grandchild)) == {child.pid, grandchild}
        assert pids(own_processes(process_tag, under=run_dir)) == {child.pid, grandchild}
        assert pids(own_processes(process_tag, under=tmp_path / "out" / "runs" / "tiny-random--llama")) == set()
        assert pids(own_processes("another-tests-tag")) == set()
    finally:
        for pid in (grandchild, twin_grandchild):
            os.kill(pid, signal.SIGKILL)


def test_an_orphan_reparented_away_from_the_test_is_still_found(process_tag: str, started: list) -> None:
    child = start(started, GRANDCHILD, "leave")
    orphan = int(child.stdout.readline())
    child.wait()
    try:
        # Its parent is gone: it is no longer in the test's process tree, but it keeps the tag.
        assert parent(orphan) not in (child.pid, os.getpid())
        assert pids(survivors(process_tag, grace_s=0)) == {orphan}
    finally:
        os.kill(orphan, signal.SIGKILL)


def test_a_rank_started_by_multiprocessing_spawn_is_found_by_its_cwd(
    tmp_path: Path, process_tag: str, started: list
) -> None:
    run_dir = tmp_path / "runs" / "tiny-random--mistral" / "cpu" / "device"
    run_dir.mkdir(parents=True)
    launcher = start(started, SPAWN, cwd=run_dir)
    rank = int(launcher.stdout.readline())
    found = {p.pid: p for p in wait_for(process_tag, rank, under=tmp_path / "runs" / "tiny-random--mistral")}
    # Its command line names neither the model nor the run directory: only its cwd, inherited
    # from the launcher, ties it to the run (and only its tag to the test).
    assert "multiprocessing" in found[rank].cmdline and "mistral" not in found[rank].cmdline
    assert found[rank].cwd == str(run_dir.resolve())
    assert launcher.pid in found
    launcher.kill()
    launcher.wait()  # the rank, its resource tracker: orphans now, and still found
    assert rank in pids(own_processes(process_tag, under=run_dir))
    os.kill(rank, signal.SIGKILL)


def test_zombies_this_process_and_its_ancestors_are_left_out(process_tag: str, started: list) -> None:
    zombie = start(started, "pass")
    deadline = time.monotonic() + 30
    while "State:\tZ" not in Path(f"/proc/{zombie.pid}/status").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert zombie.pid not in pids(own_processes(process_tag))
    zombie.wait()
    # A tagged child runs a tagged grandchild that looks: it sees neither itself nor its parent.
    look = "import faultkit, os; print([p.pid for p in faultkit.own_processes(os.environ[faultkit.TAG_VAR])])"
    nested = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {look!r}], check=True)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-c", nested], env=env, capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(out.stdout) == []


def test_a_launcher_that_dies_leaving_a_spawned_rank_is_caught_unless_run_script_kills_its_group(
    tmp_path: Path, process_tag: str
) -> None:
    """The real path: run.py (here, a stand-in) is killed outright with a rank still running;
    run_script must stop the rank with the group, and the finder sees it if it does not."""
    run_dir = tmp_path / "out" / "runs" / "tiny-random--mistral" / "cpu" / "device"
    run_dir.mkdir(parents=True)
    script = run_dir / "run.py"
    script.write_text(
        textwrap.dedent(
            """
            import multiprocessing, os, signal, sys, time
            if __name__ == "__main__":
                rank = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(60,))
                rank.start()
                print("[neuron-support] stage=load", file=sys.stderr, flush=True)
                time.sleep(1)  # the rank execs and settles in
                os.kill(os.getpid(), signal.SIGKILL)  # the launcher dies; nothing stops the rank but the group kill
            """
        )
    )
    outcome = run_script(script, run_dir / "result.json", env=os.environ, timeout=60, log_path=run_dir / "log.txt")
    assert outcome.signal_name == "SIGKILL" and outcome.last_stage == "load"
    assert survivors(process_tag, under=tmp_path / "out" / "runs" / "tiny-random--mistral") == []


def test_the_recorded_tree_holds_a_spawned_rank_while_it_ran_and_says_when_it_is_gone(
    tmp_path: Path, process_tag: str, started: list
) -> None:
    """A spawned rank records itself when its interpreter starts, so a check made after the rank
    was killed still knows it existed; alive() follows that very process, not its pid."""
    run_dir = tmp_path / "runs" / "tiny-random--mistral" / "cpu" / "device"
    run_dir.mkdir(parents=True)
    record = tmp_path / "record"
    launcher = start(started, SPAWN, cwd=run_dir, env={**os.environ, **record_tree(record)})
    rank = int(launcher.stdout.readline())
    # The rank records itself once its interpreter is up, which start() does not wait for.
    deadline = time.monotonic() + 30
    while rank not in (tree := {r.pid: r for r in recorded(record)}) and time.monotonic() < deadline:
        time.sleep(0.05)
    # Both are there, the rank known as one, in the run directory, a child of the launcher.
    assert {launcher.pid, rank} <= set(tree)
    assert tree[rank].is_rank and not tree[launcher.pid].is_rank
    assert tree[rank].ppid == launcher.pid and tree[rank].under(run_dir)
    assert tree[rank].alive() and tree[launcher.pid].alive()
    os.kill(rank, signal.SIGKILL)
    launcher.wait()
    assert not tree[rank].alive() and not tree[launcher.pid].alive()


def test_a_failed_outcome_check_lists_the_sessions_rows_and_a_met_one_is_silent(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    import pandas as pd

    pytester.makepyfile("def test_one():\n    assert True\n")
    result = pytester.runpytest()
    (tmp_path / "data").mkdir()
    rows = [("tiny-random/qwen3", "PASS", None, None), ("tiny-random/olmo2", "ERROR", "load", "RankDied: rank 3")]
    pd.DataFrame(rows, columns=["model_id", "result", "failure_stage", "error"]).to_parquet(
        tmp_path / "data" / "x.parquet"
    )
    assert_outcomes(result, tmp_path, passed=1)
    with pytest.raises(AssertionError) as failed:
        assert_outcomes(result, tmp_path, passed=2)
    message = str(failed.value)
    assert "tiny-random/olmo2: ERROR at load: RankDied: rank 3" in message and "tiny-random/qwen3: PASS" in message
    assert session_rows(tmp_path, failed_only=True) == "tiny-random/olmo2: ERROR at load: RankDied: rank 3"
    with pytest.raises(AssertionError, match="no rows in"):
        assert_outcomes(result, tmp_path / "missing", failed=1)


# Loads the report-alive conftest as a module and reports ``count`` call phases through its hook, as
# an xdist worker's session does; once loaded it says so (argv[4]/<pid>), and it starts reporting when
# the file named by argv[3] appears, so that all of them report at the same moments.
REPORTER = textwrap.dedent(
    """
    import importlib.util, os, sys, time, types
    spec = importlib.util.spec_from_file_location("report_alive", sys.argv[1])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    open(os.path.join(sys.argv[4], str(os.getpid())), "w").close()
    while not os.path.exists(sys.argv[3]):
        time.sleep(0.001)
    for i in range(int(sys.argv[2])):
        module.pytest_runtest_logreport(types.SimpleNamespace(when="call", nodeid=f"{os.getpid()}::{i}"))
    """
)


def test_reports_written_at_once_by_several_workers_are_all_kept(tmp_path: Path, started: list) -> None:
    """Each worker's item reports land in one folder at the same moments: none may take another's
    file name (a name counted from the folder's listing could) or be read half-written."""
    record = tmp_path / "record"
    env = {**os.environ, **record_tree(record)}
    conftest = tmp_path / "report_alive.py"
    conftest.write_text(report_alive_conftest())
    go, ready, workers, each = tmp_path / "go", tmp_path / "ready", 4, 100
    ready.mkdir()
    procs = [start(started, REPORTER, str(conftest), str(each), str(go), str(ready), env=env) for _ in range(workers)]
    deadline = time.monotonic() + 60
    while len(list(ready.iterdir())) < workers and time.monotonic() < deadline:
        time.sleep(0.05)
    go.touch()
    for proc in procs:
        assert proc.wait(timeout=60) == 0
    reports = [json.loads(path.read_text()) for path in (record / "reports").glob("*.json")]
    expected = {f"{proc.pid}::{i}" for proc in procs for i in range(each)}
    assert sorted(r["nodeid"] for r in reports) == sorted(expected)
    assert not list((record / "reports").glob(".*.tmp"))
    # Found by its node id, whatever its file is called: the reporter itself was alive when it reported.
    assert procs[0].pid in {r.pid for r in alive_at_report(record, f"{procs[0].pid}::7")}
