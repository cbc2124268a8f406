"""Distributed faults: one rank of a sharded run dying, by an exception or by a signal, is an
ERROR row that names the rank, no rank is left running, and the next item still runs."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
from faultkit import catalog, own_processes

pytestmark = pytest.mark.slow

# Rank 1 of the sharded mistral is killed outright after loading: it cannot report anything,
# so only the launcher can tell what happened to it.
KILL_RANK_1 = """
def pytest_neuron_support_post_load(config, model):
    if model.id == "tiny-random/mistral":
        return "import os, signal\\nif os.environ['RANK'] == '1':\\n    os.kill(os.getpid(), signal.SIGKILL)\\n"
    return None
"""


def test_a_rank_killed_by_a_signal_is_an_error_row_and_no_rank_is_left(
    pytester: pytest.Pytester, offline_hub: Path, process_tag: str
) -> None:
    pytester.makeconftest(KILL_RANK_1)
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
    assert "process 1 terminated with signal SIGKILL" in died.error, died.error
    # Neither rank 0 nor the launcher outlived the dead peer. By this test's tag, so another
    # worker's sweep of mistral is not counted; by cwd too, as spawned ranks run in the launcher's
    # run directory while their command line names neither it nor the model.
    assert own_processes(process_tag, under=pytester.path / "out" / "runs" / "tiny-random--mistral") == []
    assert df.loc["tiny-random/qwen3", "result"] == "PASS"
    assert own_processes(process_tag) == []  # nothing the sweep started is left, orphans included
