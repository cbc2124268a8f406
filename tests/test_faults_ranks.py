"""Distributed faults: one rank of a sharded run dying, by an exception or by a signal, is an
ERROR row that names the rank, no rank is left running, and the next item still runs."""

from __future__ import annotations

import re
from pathlib import Path

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
