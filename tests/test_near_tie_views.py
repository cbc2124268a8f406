"""A near-tie PASS read apart from an exact one, where a user reads rows: the session's results table,
``neuron-support show``, and ``neuron-support diff`` between an exact-mode and a near-tie-mode sweep
(which must say the settings differ, not that the model was fixed). The near-tie is real: a checkpoint
with a planted small tie (tests/ties.py) and a device fault that takes its runner-up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from faultkit import assert_outcomes
from ties import build_tie_model

from pytest_neuron_support import zoo
from pytest_neuron_support.zoo.hubcache import install_snapshot

# benchmarks/ is a directory of scripts, not a package: import from it as the benchmarks themselves do.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import faults

pytestmark = pytest.mark.slow

REPO, TIE_AT, TOKENS = "tie-test/small", 3, 8


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_neuron_support.cli", *args], cwd=cwd, capture_output=True, text=True, check=False
    )


@pytest.mark.usefixtures("eager_compile")
def test_a_near_tie_pass_is_marked_in_the_table_and_show_and_diff_says_the_modes_differ(
    pytester: pytest.Pytester,
    offline_hub: Path,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scratch = tmp_path_factory.mktemp("tie")
    tie = build_tie_model(offline_hub, scratch / "tie", zoo.TINY_PROMPT, TOKENS, {TIE_AT: 0.125}, 4.0)
    install_snapshot(scratch / "hub", REPO, tie.path)
    monkeypatch.setenv("HF_HUB_CACHE", str(scratch / "hub"))
    fault = faults.logits_fault(f"    return _second_best(scores) if step == {TIE_AT} else scores\n")
    pytester.makeconftest(
        f"def pytest_neuron_support_post_load(config, model):\n    return {fault!r} if model.id == {REPO!r} else None\n"
    )
    entry = f"  - {{id: {REPO}, task: text-generation, dtype: float32, prompt: {json.dumps(zoo.TINY_PROMPT)}}}\n"
    pytester.makefile(".yaml", models="models:\n" + entry)
    args = ("--device=cpu", f"--max-new-tokens={TOKENS}", "--reference-cache=refs", "-p", "no:cacheprovider")
    exact = pytester.runpytest_subprocess(*args, "--results-dir=exact", "--parity=exact")
    assert_outcomes(exact, pytester.path / "exact", failed=1)
    near = pytester.runpytest_subprocess(*args, "--results-dir=near-tie", "--parity=near-tie")
    assert_outcomes(near, pytester.path / "near-tie", passed=1)

    # The session's table: the parity mode is a column, and the near-tie PASS says what it is.
    near.stdout.fnmatch_lines(
        [
            "model * result   stage     parity   cores *evidence",
            f"{REPO} * PASS     -         near-tie * parity+teacher-forced; a near-tie PASS: the tokens part from "
            "the CPU's at a near-tie",
        ]
    )
    exact.stdout.fnmatch_lines([f"{REPO} * FAIL     parity    exact *"])
    shown = cli(pytester.path, "show", REPO, "--results-dir", "near-tie")
    assert shown.returncode == 0 and ": PASS (near-tie)  parity=near-tie  cores=" in shown.stdout, shown.stdout
    diff = cli(pytester.path, "diff", "exact", "near-tie")
    lines = diff.stdout.splitlines()
    assert (
        f"settings-differ {REPO} [cpu]: FAIL -> PASS (parity mode exact -> near-tie: judged under different settings)"
        in lines
    ), lines
    assert not any(line.startswith("fixed") for line in lines), lines
