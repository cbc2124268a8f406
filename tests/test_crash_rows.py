"""A worker that dies mid-item: xdist's pytest_handlecrashitem gives the controller the item, and the
controller writes its row (ERROR at stage harness); the sweep goes on with a new worker."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest

CATALOG = """\
models:
  - {id: tiny-random/qwen3, task: text-generation}
  - {id: tiny-random/llama, task: text-generation, exclude: {reason: low-priority, note: not this time}}
"""

# Kills the xdist worker the moment it starts the qwen3 item (its setup, where the check's fixture
# would run the model): a real SIGKILL of the worker process.
CONFTEST = """\
import os
import signal


def pytest_runtest_setup(item):
    if item.name == "test_model[tiny-random/qwen3]" and os.environ.get("PYTEST_XDIST_WORKER"):
        os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_worker_killed_mid_item_leaves_an_error_row_for_that_item(
    pytester: pytest.Pytester, offline_hub: Path
) -> None:
    pytester.makefile(".yaml", models=CATALOG)
    pytester.makeconftest(CONFTEST)
    out = pytester.path / "results"
    result = pytester.runpytest_subprocess("--device=cpu", f"--results-dir={out}", "-n", "2", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*worker*crashed while running*tiny-random/qwen3*"])
    rows = pd.read_parquet(out / "data").set_index("model_id")
    assert set(rows.index) == {"tiny-random/qwen3", "tiny-random/llama"}
    crashed = rows.loc["tiny-random/qwen3"]
    assert (crashed.result, crashed.failure_stage, crashed.verdict_basis) == ("ERROR", "harness", "run")
    assert "the pytest worker died while checking this model" in crashed.error
    assert "crashed while running" in crashed.error
    assert rows.loc["tiny-random/llama"].result == "EXCLUDED"


USER_TEST = """\
import os
import signal

import pytest


@pytest.mark.neuron_cores(1)
def test_my_server_dies(neuron_cores):
    os.kill(os.getpid(), signal.SIGKILL)  # the worker dies holding its lease


def test_plain_dies():
    os.kill(os.getpid(), signal.SIGKILL)  # no neuron fixture: no row
"""


def test_a_worker_killed_in_a_users_fixture_test_leaves_that_tests_row(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_mine=USER_TEST)
    out = pytester.path / "results"
    # A marker left by an earlier session must not stand for this one's plain test.
    stale = out / "runs" / "tests" / "test_mine.py--test_plain_dies" / "started.json"
    stale.parent.mkdir(parents=True)
    stale.write_text('{"nodeid": "test_mine.py::test_plain_dies", "model_id": null}')
    os.utime(stale, (1, 1))
    result = pytester.runpytest_subprocess("--device=cpu", f"--results-dir={out}", "-n", "2", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=2)
    [row] = pd.read_parquet(out / "data").to_dict("records")
    assert (row["test"], row["model_id"], row["source"]) == (
        "test_mine.py::test_my_server_dies",
        "test_mine.py::test_my_server_dies",
        "test",
    )
    assert (row["result"], row["failure_stage"], row["verdict_basis"]) == ("ERROR", "harness", "test")
    assert "the pytest worker died while running this test" in row["error"] and "crashed" in row["error"]
