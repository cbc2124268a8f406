"""README promises that only a real run can keep: --device auto picks what torch sees (cpu here),
a plan that needs more cores than allowed is a SKIPPED row at stage plan, and --resume reruns a
model whose settings changed."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from faultkit import catalog

pytestmark = pytest.mark.slow


def test_device_auto_runs_on_what_torch_sees(pytester: pytest.Pytester, offline_hub: Path) -> None:
    pytester.makefile(".yaml", models=catalog("tiny-random/qwen3"))
    result = pytester.runpytest_subprocess("--device=auto", "--results-dir=out", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    [row] = pd.read_parquet(pytester.path / "out" / "data").to_dict("records")
    # No Trainium or GPU on this machine: auto is cpu, with the cpu row's compile backend.
    assert (row["device"], row["result"], row["compile_backend"]) == ("cpu", "PASS", "inductor")


def test_more_cores_than_allowed_is_a_skipped_row_at_plan(pytester: pytest.Pytester, offline_hub: Path) -> None:
    # mistral's entry asks for 2 cores; --max-cores=1 forbids it. No run, a row saying what to pass.
    pytester.makefile(".yaml", models=catalog("tiny-random/mistral").replace("prompt:", "cores: 2, prompt:"))
    result = pytester.runpytest_subprocess("--device=cpu", "--results-dir=out", "--max-cores=1", "-rs")
    result.assert_outcomes(skipped=1)
    [row] = pd.read_parquet(pytester.path / "out" / "data").to_dict("records")
    assert (row["result"], row["failure_stage"], row["verdict_basis"]) == ("SKIPPED", "plan", "plan")
    assert "--max-cores=1" in row["error"] and pd.isna(row["run_s"]), row["error"]
    assert not (pytester.path / "out" / "runs" / "tiny-random--mistral").exists()  # nothing ran


def test_resume_reruns_a_model_whose_settings_changed(pytester: pytest.Pytester, offline_hub: Path) -> None:
    pytester.makefile(".yaml", models=catalog("tiny-random/qwen3"))
    first = pytester.runpytest_subprocess("--device=cpu", "--results-dir=out", "--max-new-tokens=16")
    first.assert_outcomes(passed=1)
    same = pytester.runpytest_subprocess("--device=cpu", "--results-dir=out", "--max-new-tokens=16", "--resume", "-rs")
    same.assert_outcomes(skipped=1)
    same.stdout.fnmatch_lines(["*resumed: PASS already recorded for this stack and settings*"])
    changed = pytester.runpytest_subprocess("--device=cpu", "--results-dir=out", "--max-new-tokens=24", "--resume")
    changed.assert_outcomes(passed=1)
    [row] = pd.read_parquet(pytester.path / "out" / "data").to_dict("records")
    assert (row["result"], row["max_new_tokens"], len(row["tokens"])) == ("PASS", 24, 24)
