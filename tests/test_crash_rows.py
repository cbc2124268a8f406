"""A worker that dies mid-item: xdist's pytest_handlecrashitem gives the controller the item, and the
controller writes its row (ERROR at stage harness); the sweep goes on with a new worker."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

CATALOG = """\
models:
  - {id: tiny-random/qwen3, task: text-generation}
  - {id: tiny-random/llama, task: text-generation, exclude: {reason: low-priority, note: not this time}}
"""

# Kills the xdist worker the moment it starts the qwen3 item: a real SIGKILL of the worker process.
CONFTEST = """\
import os
import signal


def pytest_runtest_call(item):
    if item.name == "tiny-random/qwen3" and os.environ.get("PYTEST_XDIST_WORKER"):
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
