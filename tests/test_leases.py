"""Host-wide core leases through the plugin, as two runners on one host meet them: two pytest sessions
started at once over one slice of the host never hold the same core at the same time, and every
lease falls inside the slice they were given; a SIGKILLed session leaves no run or rank behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from faultkit import catalog, own_processes, survivors
from test_sweep import overlapping_leases

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("eager_compile")]

SESSION_A = ["tiny-random/qwen3", "tiny-random/qwen2", "tiny-random/llama"]
SESSION_B = ["tiny-random/smollm3", "tiny-random/gpt2", "tiny-random/phi3"]


def _session(workdir: Path, models: list[str], env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    workdir.mkdir()
    (workdir / "models.yaml").write_text(catalog(*models))
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--device=cpu", "--results-dir=out", *args],
        cwd=workdir,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@pytest.mark.usefixtures("shared_references")
def test_two_concurrent_sessions_over_one_slice_never_double_book_a_core(
    pytester: pytest.Pytester, offline_hub: Path, tmp_path: Path
) -> None:
    # Both sessions get the same two host cores (4 and 5) and the same ledger: each could use both.
    env = {**os.environ, "NEURON_SUPPORT_CORE_LEDGER": str(tmp_path / "ledger"), "NEURON_SUPPORT_VISIBLE_CORES": "4-5"}
    sessions = [
        _session(pytester.path / "a", SESSION_A, env, "-n", "2"),
        _session(pytester.path / "b", SESSION_B, env, "-n", "2"),
    ]
    for session in sessions:
        assert session.wait(timeout=1500) == 0
    a = pd.read_parquet(pytester.path / "a" / "out" / "data")
    b = pd.read_parquet(pytester.path / "b" / "out" / "data")
    both = pd.concat([a, b], ignore_index=True)
    assert sorted(both.model_id) == sorted(SESSION_A + SESSION_B) and set(both.result) == {"PASS"}
    assert set(both.first_core) <= {4, 5}  # inside the slice, in the host's numbering
    assert overlapping_leases(both) == []  # 0 double-booked core-seconds across the two sessions
    # They did share the slice: at some moment both sessions held a core of it.
    assert any(
        x.lease_start < y.lease_end and y.lease_start < x.lease_end for x in a.itertuples() for y in b.itertuples()
    ), "the two sessions never ran at the same time: nothing was proven"


# Every device run hangs once loaded; each process that gets there (run.py, or each rank of a sharded
# run) first leaves a marker named by its pid in its working directory, so the test knows which
# processes were loaded and alive when it sends the kill.
HANG = """
def pytest_neuron_support_post_load(config, model):
    return "import os, time\\nopen(f'loaded-{os.getpid()}', 'w').close()\\ntime.sleep(900)\\n"
"""


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["in-process", "xdist"])
def test_a_sigkilled_session_leaves_no_run_or_rank_holding_cores(
    pytester: pytest.Pytester, offline_hub: Path, process_tag: str, workers: list[str]
) -> None:
    pytester.makeconftest(HANG)
    pytester.makefile(
        ".yaml",
        models=catalog("tiny-random/mistral", "tiny-random/qwen3").replace(
            "{id: tiny-random/mistral,", "{id: tiny-random/mistral, cores: 2,"
        ),
    )
    session = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--device=cpu", "--neuron-cores=4", *workers],
        cwd=pytester.path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    runs = pytester.path / "results" / "runs"
    # Wait until the 2-core run's two ranks are loaded and hanging (it starts first: largest first), and
    # under xdist, where the pool of 4 holds both at once, the 1-core run.py on the other worker too.
    want = {"tiny-random--mistral": 2, **({"tiny-random--qwen3": 1} if workers else {})}
    deadline = time.monotonic() + 600
    while True:
        loaded = {
            slug: sorted(int(p.name.split("-")[1]) for p in (runs / slug / "cpu" / "device").glob("loaded-*"))
            for slug in want
        }
        if all(len(loaded[slug]) == n for slug, n in want.items()):
            break
        assert session.poll() is None, f"the session ended before its runs were loaded: {loaded}"
        if time.monotonic() > deadline:
            pytest.fail(f"the device runs never all reached the hang: {loaded}")
        time.sleep(0.5)
    before = own_processes(process_tag, under=runs)
    alive = {p.pid: p for p in before}
    # Every loaded process was alive when the kill went out, the sharded run's two as ranks: the
    # check below is about them.
    assert all(pid in alive for pids in loaded.values() for pid in pids), (loaded, before)
    assert all("multiprocessing.spawn" in alive[pid].cmdline for pid in loaded["tiny-random--mistral"]), before
    session.send_signal(signal.SIGKILL)  # the pytest process only: no cleanup of any kind runs
    session.wait()
    # The kernel ends the rest: workers with their controller, run.py with its parent, ranks with run.py.
    assert survivors(process_tag, grace_s=20.0) == [], before
