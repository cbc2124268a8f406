"""run_script against real child processes: results, crashes, hangs with grandchildren."""

from __future__ import annotations

import os
import textwrap
import threading
import time
from pathlib import Path

from pytest_neuron_support.run.execution import run_script


def gone(pid: int) -> bool:
    """Absent, or a zombie waiting for init to reap it (it holds no resources then)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "State:\tZ" in status


def wait_gone(pid: int, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if gone(pid):
            return True
        time.sleep(0.1)
    return False


def script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "run.py"
    path.write_text(
        "import argparse, json, os, sys, time, signal, subprocess\n"
        "p = argparse.ArgumentParser(); p.add_argument('--out'); args = p.parse_args()\n"
        "def stage(s): print(f'[neuron-support] stage={s}', file=sys.stderr, flush=True)\n" + textwrap.dedent(body)
    )
    return path


def test_result_is_read_back(tmp_path: Path) -> None:
    s = script(
        tmp_path, "stage('load'); stage('generate'); json.dump({'ok': True, 'tokens': [1]}, open(args.out, 'w'))\n"
    )
    outcome = run_script(s, tmp_path / "r.json", env=os.environ, timeout=60, log_path=tmp_path / "log")
    assert outcome.returncode == 0 and not outcome.timed_out
    assert outcome.result == {"ok": True, "tokens": [1]}
    assert outcome.last_stage == "generate"


def test_segfault_is_classified_with_its_stage(tmp_path: Path) -> None:
    s = script(tmp_path, "stage('compile'); os.kill(os.getpid(), signal.SIGSEGV)\n")
    outcome = run_script(s, tmp_path / "r.json", env=os.environ, timeout=60, log_path=tmp_path / "log")
    assert outcome.result is None
    assert outcome.signal_name == "SIGSEGV" and outcome.last_stage == "compile"


def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    s = script(
        tmp_path,
        f"""
        child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])
        open({str(pidfile)!r}, 'w').write(str(child.pid))
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a stubborn script: SIGKILL must follow
        stage('compile')
        time.sleep(600)
        """,
    )
    start = time.monotonic()
    outcome = run_script(s, tmp_path / "r.json", env=os.environ, timeout=2, log_path=tmp_path / "log")
    assert outcome.timed_out and outcome.last_stage == "compile"
    assert time.monotonic() - start < 30
    child = int(pidfile.read_text())
    assert wait_gone(child), f"grandchild {child} survived the timeout"


def test_children_left_behind_after_exit_are_killed(tmp_path: Path) -> None:
    s = script(
        tmp_path,
        """
        child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])
        print(child.pid, flush=True)
        json.dump({'ok': True}, open(args.out, 'w'))
        """,
    )
    outcome = run_script(s, tmp_path / "r.json", env=os.environ, timeout=60, log_path=tmp_path / "log")
    assert outcome.result == {"ok": True}
    pid = int(outcome.log_path.read_text().split()[0])
    assert wait_gone(pid), f"child {pid} outlived its run.py"


def test_exit_without_result(tmp_path: Path) -> None:
    s = script(tmp_path, "stage('load'); sys.exit(3)\n")
    outcome = run_script(s, tmp_path / "r.json", env=os.environ, timeout=60, log_path=tmp_path / "log")
    assert outcome.returncode == 3 and outcome.result is None and outcome.signal_name is None
    assert outcome.last_stage == "load"


def test_cancel_from_another_thread_kills_the_group_early_and_is_not_a_timeout(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    s = script(
        tmp_path,
        f"""
        child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])
        open({str(pidfile)!r}, 'w').write(str(child.pid))
        stage('load')
        time.sleep(600)
        """,
    )
    cancel = threading.Event()
    threading.Timer(1.0, cancel.set).start()
    start = time.monotonic()
    outcome = run_script(s, tmp_path / "r.json", env=os.environ, timeout=300, log_path=tmp_path / "log", cancel=cancel)
    assert time.monotonic() - start < 30
    assert not outcome.timed_out and outcome.result is None and outcome.returncode < 0
    assert wait_gone(int(pidfile.read_text()))


def test_tokens_in_the_environment_are_masked_in_the_log_result_and_rank_results(tmp_path: Path) -> None:
    # The script prints its token, writes it into its result and into a rank's result, beside a
    # byte that is not UTF-8 (a log is bytes: masking must not garble the rest).
    token = "hf_unitCANARY0123456789"
    s = script(
        tmp_path,
        "tok = os.environ['HF_TOKEN']\n"
        "print('out', tok, flush=True); print('err', tok, file=sys.stderr, flush=True)\n"
        "sys.stdout.buffer.write(b'raw \\xff end\\n'); sys.stdout.flush()\n"
        "open(args.out + '.rank1', 'w').write(tok)\n"
        "json.dump({'ok': False, 'error': 'bad ' + tok}, open(args.out, 'w'))\n",
    )
    env = {**os.environ, "HF_TOKEN": token}
    outcome = run_script(s, tmp_path / "r.json", env=env, timeout=60, log_path=tmp_path / "log")
    assert outcome.result == {"ok": False, "error": "bad ***"}
    log = (tmp_path / "log").read_bytes()
    assert b"out ***\n" in log and b"err ***\n" in log and b"raw \xff end\n" in log
    assert token.encode() not in log
    assert (tmp_path / "r.json.rank1").read_text() == "***"
    assert outcome.log_tail().count("***") == 2
