"""The teacher-forced CPU check's cache is keyed by the tokens it scores: a sharded run whose device
swapped a token, after a healthy run of the same model with the same cache, runs its own check and
FAILs. Were the tokens left out of the key, the swapped run would be handed the healthy run's scores
(every position the CPU's top-1) and PASS."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest
from faultkit import assert_outcomes, catalog

# benchmarks/ is a directory of scripts, not a package: import from it as the benchmarks themselves do.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import faults

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("eager_compile")]

#: Where the device's pick is swapped for its runner-up (on every rank, so the ranks stay in step).
SWAPPED_AT = 2
SWAP = faults.logits_fault(f"    return _second_best(scores) if step == {SWAPPED_AT} else scores\n")


def test_a_token_swapped_sharded_run_after_a_healthy_one_reruns_the_check_and_fails(
    pytester: pytest.Pytester, offline_hub: Path
) -> None:
    models = "judge: {model: tiny-random/judge}\n" + catalog("tiny-random/llama").replace(
        "{id: tiny-random/llama,", "{id: tiny-random/llama, cores: 2,"
    )
    pytester.makefile(".yaml", models=models)
    # One check cache for both sessions, as a user's ~/.cache is.
    args = (
        "--device=cpu",
        "--neuron-cores=2",
        "--max-new-tokens=8",
        "--reference-cache=checks",
        "-p",
        "no:cacheprovider",
    )
    healthy_run = pytester.runpytest_subprocess(*args, "--results-dir=healthy")
    assert_outcomes(healthy_run, pytester.path / "healthy", passed=1)
    [healthy] = pd.read_parquet(pytester.path / "healthy" / "data").to_dict("records")
    assert (healthy["verdict_basis"], healthy["cpu_check"], healthy["positions_disagreeing"]) == (
        "teacher-forced",
        "ran",
        0,
    )

    pytester.makeconftest(f"def pytest_neuron_support_post_load(config, model):\n    return {SWAP!r}\n")
    swapped_run = pytester.runpytest_subprocess(*args, "--results-dir=swapped")
    assert_outcomes(swapped_run, pytester.path / "swapped", failed=1)
    [swapped] = pd.read_parquet(pytester.path / "swapped" / "data").to_dict("records")
    tokens, before = list(swapped["tokens"]), list(healthy["tokens"])
    assert tokens[:SWAPPED_AT] == before[:SWAPPED_AT] and tokens[SWAPPED_AT] != before[SWAPPED_AT], (tokens, before)
    # Its own check ran (other tokens, another key), not the healthy run's cached one, and found the swap.
    assert swapped["cpu_check"] == "ran", swapped["cpu_check"]
    assert (swapped["result"], swapped["failure_stage"], swapped["verdict_basis"]) == (
        "FAIL",
        "parity",
        "teacher-forced",
    )
    assert swapped["first_disagreement"] == SWAPPED_AT and swapped["disagreement_device_token"] == tokens[SWAPPED_AT]
    assert swapped["disagreement_cpu_token"] == before[SWAPPED_AT] and swapped["disagreement_rank"] == 1
    assert f"first at position {SWAPPED_AT} of 8" in swapped["error"], swapped["error"]
    checks = sorted(path.name for path in (pytester.path / "checks").glob("*.json"))
    assert len(checks) == 2, checks  # one entry per scored token sequence
    assert "_second_best" in swapped["runscript"]  # the device run carried the swap
