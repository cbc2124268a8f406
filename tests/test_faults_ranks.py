"""Distributed faults: one rank of a sharded run dying, by an exception or by a signal, is an
ERROR row that names the rank, no rank is left running, and the next item still runs."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from faultkit import alive_at_report, catalog, own_processes, record_tree, recorded, report_alive_conftest

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("eager_compile")]

# Rank 1 of the sharded mistral is killed outright after loading: it cannot report anything,
# so only the launcher can tell what happened to it.
KILL_RANK_1 = """
def pytest_neuron_support_post_load(config, model):
    if model.id == "tiny-random/mistral":
        return "import os, signal\\nif os.environ['RANK'] == '1':\\n    os.kill(os.getpid(), signal.SIGKILL)\\n"
    return None
"""


def test_a_rank_killed_by_a_signal_is_an_error_row_and_no_rank_is_left(
    pytester: pytest.Pytester, offline_hub: Path, process_tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makeconftest(KILL_RANK_1 + report_alive_conftest())
    record = pytester.path / "record"
    for name, value in record_tree(record).items():
        monkeypatch.setenv(name, value)
    models = catalog("tiny-random/mistral", "tiny-random/qwen3").replace(
        "{id: tiny-random/mistral,", "{id: tiny-random/mistral, cores: 2,"
    )
    pytester.makefile(".yaml", models=models)
    result = pytester.runpytest_subprocess(
        "--device=cpu", "--neuron-cores=2", "--results-dir=out", "--model-timeout=600"
    )
    result.assert_outcomes(passed=1, failed=1)
    df = pd.read_parquet(pytester.path / "out" / "data").set_index("model_id")
    died = df.loc["tiny-random/mistral"]
    assert (died.result, died.failure_stage, died.neuron_cores) == ("ERROR", "load", 2)
    # Rank 0 may be stopped by the launcher before it reports, so it can be listed too.
    assert re.search(r"rank\(s\) \[(0, )?1\] died without a result", died.error), died.error
    assert "rank 1 terminated with signal SIGKILL" in died.error, died.error

    # The tree as it ran (each process recorded itself when it started): the launcher, run.py in
    # mistral's run directory, spawned both ranks (spawn, not fork: a forked rank is no new
    # interpreter and records nothing).
    run_dir = pytester.path / "out" / "runs" / "tiny-random--mistral"
    tree = [r for r in recorded(record) if r.under(run_dir)]
    launchers = [r for r in tree if not r.is_rank and any(a.endswith("run.py") for a in r.argv)]
    assert len(launchers) == 1, tree
    ranks = [r for r in tree if r.is_rank and r.ppid == launchers[0].pid]
    assert len(ranks) == 2, tree
    # None of them, nor anything they started, was alive when the item reported: the dead peer
    # took rank 0 and the launcher with it then, not at the end of the session.
    assert [r for r in alive_at_report(record, "tiny-random/mistral") if r.under(run_dir)] == []
    assert df.loc["tiny-random/qwen3", "result"] == "PASS"
    # Nothing the sweep started is left: no recorded process (the same process, not a reused
    # pid), and no process with this test's tag (a non-Python one, an orphan).
    assert [r for r in recorded(record) if r.alive()] == []
    assert own_processes(process_tag) == []


#: Rank 0 outlives its failing peer and fails after it, as a rank blocked in a collective does ("Connection
#: closed by peer"): the launcher's SIGTERM reaches it in its own code, which raises and writes a result.
#: Rank 1 fails only once rank 0 is ready to (its handler installed, a file says so: the ranks load at
#: their own pace, and a rank 0 still loading would die of the SIGTERM without a word).
RANK0_FAILS_AFTER = """
import os, signal, time
ready = os.path.join(os.path.dirname(SPEC["out"]), "rank0-ready")
def after(signum, frame):
    raise RuntimeError("Connection closed by peer (rank 0, after its peer)")
if os.environ["RANK"] == "0":
    signal.signal(signal.SIGTERM, after)
    open(ready, "w").close()
    time.sleep(300)
deadline = time.monotonic() + 120
while not os.path.exists(ready) and time.monotonic() < deadline:
    time.sleep(0.01)
"""
CAUSES = {
    "raises": 'if os.environ["RANK"] == "1":\n    raise RuntimeError("boom on rank 1")\n',
    "is killed": 'if os.environ["RANK"] == "1":\n    os.kill(os.getpid(), signal.SIGKILL)\n',
    # SystemExit is no Exception: without its own failed_at the launcher would see rank 1 end only after
    # its interpreter shut down, later than rank 0's failure.
    "exits": 'if os.environ["RANK"] == "1":\n    raise SystemExit(5)\n',
}
#: (error_type, how the error starts) of the row, per cause.
NAMED = {
    "raises": ("RuntimeError", "rank 1: boom on rank 1"),
    "is killed": ("RankDied", "rank(s) [1] died without a result: rank 1 terminated with signal SIGKILL"),
    "exits": ("SystemExit", "rank 1: 5"),
}


@pytest.mark.parametrize("cause", sorted(CAUSES))
def test_the_rank_that_failed_first_is_named_whatever_rank_0_saw_after_it(
    offline_hub: Path, tmp_path: Path, cause: str
) -> None:
    # Rank 0's own failure comes after rank 1's and is first in rank order: the row must still name
    # rank 1, at the stage rank 1 reached, and keep rank 0's view as evidence after it.
    result = run_two_ranks(tmp_path, RANK0_FAILS_AFTER + CAUSES[cause])
    assert result["stage"] == "load", result
    error_type, start = NAMED[cause]
    assert result["error_type"] == error_type, result
    assert result["error"].startswith(start), result["error"]
    # What rank 0 saw after it is kept, below the cause.
    assert "rank 0 then failed at load: RuntimeError: Connection closed by peer" in result["error"], result["error"]
    assert not list(tmp_path.glob("r.json.rank*.stage"))  # the launcher cleans up after its ranks


def test_a_rank_that_dies_after_writing_a_good_result_fails_the_run_naming_it(
    offline_hub: Path, tmp_path: Path
) -> None:
    # A crash in teardown (the runtime's, the process group's) after every rank reported success: the
    # run is not a PASS, and the launcher names the rank and how it ended instead of crashing itself.
    teardown = 'import atexit\nif os.environ["RANK"] == "1":\n    atexit.register(os._exit, 3)\n'
    result = run_two_ranks(tmp_path, "import os\n" + teardown)
    assert result["error_type"] == "RankDied", result
    assert (
        result["error"]
        == "rank(s) [] died without a result: rank 1 terminated with exit code 3, after writing a good result"
    )


def run_two_ranks(tmp_path: Path, post_load: str) -> dict[str, Any]:
    """A 2-rank tiny llama run.py with ``post_load`` planted after loading; its failed merged result."""
    from pytest_neuron_support import zoo
    from pytest_neuron_support.devices.table import DEVICES
    from pytest_neuron_support.run.execution import run_script
    from pytest_neuron_support.run.runscript import RunSpec, render

    spec = RunSpec(
        model="tiny-random/llama",
        revision="main",
        task="text-generation",
        dtype="bfloat16",
        prompt=zoo.TINY_PROMPT,
        max_new_tokens=4,
        device=DEVICES["cpu"],
        compile=False,
        compile_backend="eager",
        world_size=2,
        distributed_configs=({"tp_size": 2},),
        post_load=post_load,
    )
    script = tmp_path / "run.py"
    script.write_text(render(spec), encoding="utf-8")
    outcome = run_script(script, tmp_path / "r.json", env=os.environ, timeout=300, log_path=tmp_path / "log")
    result = outcome.result
    assert result is not None and not result["ok"], outcome.log_tail()
    return result


_ROOT_COMM_SCRIPT = """
import json, os, signal, socket, sys, time

VARIABLE = "NEURON_SUPPORT_TEST_ROOT_COMM_ID"

def rank_entry(rank, world, rendezvous, out):
    import torch.distributed as dist

    port = int(sys.argv[2])
    try:
        join_process_group(dist, "gloo", rank, world, rendezvous, root_comm=(VARIABLE, port))
        seen = {"root_comm": os.environ[VARIABLE]}
        # Both ranks through the group before either tears it down: rank 0's init can return while rank 1
        # is still connecting gloo's mesh to it, and a rank 0 that destroyed the group at once failed rank 1
        # with "Gloo connectFullMesh failed" (seen once in a full suite run on 2 busy CPUs). run.py's ranks
        # always run collectives (the sharded load) before their teardown.
        dist.barrier()
        dist.destroy_process_group()
    except RuntimeError as exc:
        seen = {"error": str(exc)}
    with open(f"{out}.rank{rank}", "w") as handle:
        json.dump(seen, handle)
    if "error" in seen:
        sys.exit(1)

@@LAUNCHER@@

if __name__ == "__main__":
    print(json.dumps({"failure": spawn_ranks(2, sys.argv[1])}))
"""


def test_rank_zero_publishes_the_runtime_root_comm_port_of_the_lease_and_refuses_a_taken_one(tmp_path: Path) -> None:
    # torch-neuronx picks NEURON_RT_ROOT_COMM_ID's port free now and binds it later when the variable is
    # unset: two concurrent sharded runs can collide. run.py sets it from the lease (one port per first
    # core, leases being exclusive), rank 0 checks it is free and publishes it beside the store's port,
    # and every rank has the same value before the group starts.
    import json
    import socket
    import subprocess
    import sys

    from pytest_neuron_support.doctor.render import common_parts

    namespace: dict[str, object] = {}
    exec(compile(common_parts(("ROOT_COMM_BASE", "root_comm_port")), "common.py", "exec"), namespace)
    root_comm_port = namespace["root_comm_port"]
    assert callable(root_comm_port)
    assert [root_comm_port(0), root_comm_port(8), root_comm_port(63)] == [61100, 61108, 61163]
    assert root_comm_port(63) > 60999  # above Linux's ephemeral range: the kernel never hands it out

    script = tmp_path / "ranks.py"
    launcher = common_parts(("join_process_group", "spawn_ranks"), defined={"rank_entry"})  # run.py's own
    script.write_text(_ROOT_COMM_SCRIPT.replace("@@LAUNCHER@@", launcher), encoding="utf-8")

    def launch(port: int, out: Path) -> tuple[dict[str, object], list[dict[str, str]]]:
        proc = subprocess.run(
            [sys.executable, str(script), str(out), str(port)], capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        ranks = []
        for rank in range(2):
            path = Path(f"{out}.rank{rank}")
            ranks.append(json.loads(path.read_text()) if path.exists() else {})
        return json.loads(proc.stdout.strip().splitlines()[-1]), ranks

    with socket.socket() as probe:  # a port this test holds for a moment: a free one to publish
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    launched, ranks = launch(free, tmp_path / "free.json")
    assert launched["failure"] is None, ranks
    assert ranks == [{"root_comm": f"127.0.0.1:{free}"}] * 2
    with socket.socket() as taken:  # another process's port: rank 0 says so, nobody starts on it
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        launched, ranks = launch(busy, tmp_path / "busy.json")
    assert launched["failure"] == "rank 0 terminated with exit code 1", ranks
    assert f"NEURON_SUPPORT_TEST_ROOT_COMM_ID: port {busy} is taken by another process" in ranks[0]["error"]
