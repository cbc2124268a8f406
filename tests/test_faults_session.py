"""Session faults: a SIGKILL of the whole pytest session mid-sweep keeps the rows of finished
items, and --resume completes the sweep with no item run twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from faultkit import catalog

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("eager_compile")]


@pytest.mark.usefixtures("shared_references")
def test_a_killed_session_keeps_finished_rows_and_resume_runs_the_rest_once(
    pytester: pytest.Pytester, offline_hub: Path
) -> None:
    ids = ["tiny-random/qwen3", "tiny-random/qwen2", "tiny-random/llama"]
    pytester.makefile(".yaml", models=catalog(*ids))
    out = pytester.path / "out"
    session = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--device=cpu", f"--results-dir={out}"],
        cwd=pytester.path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    parts = out / ".parts"
    deadline = time.monotonic() + 600
    while not list(parts.glob("*/*.json")) and time.monotonic() < deadline:
        time.sleep(0.5)
    os.killpg(session.pid, signal.SIGKILL)  # the whole session, mid-sweep, no cleanup
    session.wait()
    finished = [json.loads(p.read_text())["model_id"] for p in parts.glob("*/*.json")]
    assert len(finished) >= 1 and not (out / "data").exists()

    result = pytester.runpytest_subprocess("--device=cpu", f"--results-dir={out}", "--resume", "-rs")
    df = pd.read_parquet(out / "data")
    assert sorted(df.model_id) == sorted(ids)  # nothing lost, nothing twice
    assert set(df.result) == {"PASS"}
    skipped = [line for line in result.outlines if "resumed: PASS already recorded" in line]
    assert len(skipped) == len(set(finished))
    result.assert_outcomes(passed=len(ids) - len(set(finished)), skipped=len(set(finished)))
