"""README promises that only a real run can keep: --device auto picks what torch sees (cpu here),
a plan that needs more cores than allowed is a SKIPPED row at stage plan, --resume reruns a
model whose settings changed, and --parity near-tie passes a real near-tie that exact parity fails."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from faultkit import assert_outcomes, catalog
from ties import TieModel, build_tie_model

from pytest_neuron_support import zoo
from pytest_neuron_support.zoo.hubcache import install_snapshot

# benchmarks/ is a directory of scripts, not a package: import from it as the benchmarks themselves do.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import faults

pytestmark = pytest.mark.slow


@pytest.mark.usefixtures("shared_references")
def test_device_auto_runs_on_what_torch_sees(pytester: pytest.Pytester, offline_hub: Path) -> None:
    pytester.makefile(".yaml", models=catalog("tiny-random/qwen3"))
    result = pytester.runpytest_subprocess("--device=auto", "--results-dir=out", "-p", "no:cacheprovider")
    assert_outcomes(result, pytester.path / "out", passed=1)
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


@pytest.mark.usefixtures("eager_compile")
@pytest.mark.usefixtures("shared_references")
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


# Near-ties of known size at known positions (tests/ties.py): in a checkpoint whose CPU run has, at
# generation step TIE_AT, its top-1 only SMALL_GAP nats above its runner-up (BIG_GAP everywhere else),
# a device fault (the post-load hook) picks the runner-up at the steps below. The near-tie rule measures
# a miss in the CPU's distribution, so the size of each miss is the checkpoint's, known by construction;
# nothing depends on how this machine's CPU rounds. float32 keeps the gaps exact to about 1e-6 nats.
TIE_AT, BIG_AT = 3, 5
SMALL_GAP, BIG_GAP = 0.125, 4.0  # well inside and far outside the 0.5-nat near-tie tolerance
TOKENS = 8
FLIPS = {"tie-test/small": (TIE_AT,), "tie-test/big": (BIG_AT,), "tie-test/both": (TIE_AT, BIG_AT)}


def _tie_sessions(pytester: pytest.Pytester, zoo_cache: Path, scratch: Path) -> tuple[TieModel, dict[str, Any]]:
    """Both parity modes over the three planted runs; (the checkpoint, {mode: {model: row}})."""
    tie = build_tie_model(zoo_cache, scratch / "tie", zoo.TINY_PROMPT, TOKENS, {TIE_AT: SMALL_GAP}, BIG_GAP)
    hub = scratch / "hub"
    for repo in FLIPS:
        install_snapshot(hub, repo, tie.path)
    sources = {
        repo: faults.logits_fault(f"    return _second_best(scores) if step in {steps!r} else scores\n")
        for repo, steps in FLIPS.items()
    }
    pytester.makeconftest(
        f"SOURCES = {sources!r}\n\n\ndef pytest_neuron_support_post_load(config, model):\n"
        "    return SOURCES.get(model.id)\n"
    )
    prompt = json.dumps(zoo.TINY_PROMPT)
    entries = "".join(
        f"  - {{id: {repo}, task: text-generation, dtype: float32, prompt: {prompt}}}\n" for repo in FLIPS
    )
    pytester.makefile(".yaml", models="models:\n" + entries)
    args = ("--device=cpu", f"--max-new-tokens={TOKENS}", "--reference-cache=refs", "-p", "no:cacheprovider")
    rows: dict[str, Any] = {}
    for parity, outcome in (("exact", {"failed": 3}), ("near-tie", {"passed": 1, "failed": 2})):
        result = pytester.runpytest_subprocess(*args, f"--results-dir={parity}", f"--parity={parity}")
        assert_outcomes(result, pytester.path / parity, **outcome)
        rows[parity] = pd.read_parquet(pytester.path / parity / "data").set_index("model_id").to_dict("index")
    return tie, rows


@pytest.mark.usefixtures("eager_compile")
def test_near_tie_parity_passes_a_planted_small_tie_and_fails_a_big_one(
    pytester: pytest.Pytester,
    offline_hub: Path,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scratch = tmp_path_factory.mktemp("ties")
    monkeypatch.setenv("HF_HUB_CACHE", str(scratch / "hub"))  # the sessions load the tie checkpoints only
    tie, rows = _tie_sessions(pytester, offline_hub, scratch)
    c = tie.cycle
    assert tie.tokens == c[:TOKENS] and tie.gaps[TIE_AT] == SMALL_GAP
    # What the device decoded: the cycle, skipping one token at each planted step.
    decoded = {
        "tie-test/small": [*c[:3], *c[4:9]],
        "tie-test/big": [*c[:5], *c[6:9]],
        "tie-test/both": [*c[:3], c[4], c[5], *c[7:10]],
    }
    for parity in ("exact", "near-tie"):
        for repo, tokens in decoded.items():
            row = rows[parity][repo]
            assert list(row["tokens"]) == tokens and list(row["reference_tokens"]) == list(tie.tokens), (parity, repo)
            assert (row["verdict_basis"], row["dtype"], row["repeat_identical"]) == (
                "parity+teacher-forced",
                "float32",
                True,
            )
    exact, near = rows["exact"], rows["near-tie"]
    # Every session scored the device's own tokens in a teacher-forced pass of its own or the same pass cached.
    assert {row["cpu_check"] for row in exact.values()} == {"ran"}, exact
    assert {row["cpu_check"] for row in near.values()} == {"cached"}, near

    # The small tie: exact parity FAILs at the planted index, both checks call it a near-tie, and the
    # near-tie mode PASSes it.
    small = exact["tie-test/small"]
    assert (small["result"], small["failure_stage"], small["reference_match"]) == ("FAIL", "parity", False)
    assert (small["first_divergence"], small["matched_prefix"], small["near_tie"]) == (TIE_AT, TIE_AT, True)
    assert (small["device_token"], small["reference_token"]) == (c[TIE_AT + 1], c[TIE_AT])
    assert small["logprob_gap"] == pytest.approx(SMALL_GAP, abs=1e-5)
    assert (small["positions_checked"], small["positions_disagreeing"], small["first_disagreement"]) == (
        TOKENS,
        1,
        TIE_AT,
    )
    assert (small["disagreement_device_token"], small["disagreement_cpu_token"]) == (c[TIE_AT + 1], c[TIE_AT])
    assert small["disagreement_rank"] == 1 and small["disagreements_near_tie"] == True  # noqa: E712 (numpy bool)
    assert small["disagreement_deficit"] == pytest.approx(SMALL_GAP, abs=1e-5)
    assert f"at index {TIE_AT} of {TOKENS} (device {c[TIE_AT + 1]}, reference {c[TIE_AT]}, gap 0.12" in small["error"]
    assert (
        f"teacher-forced CPU check: 1 of {TOKENS} device tokens are not the CPU top-1; first at position {TIE_AT} of"
        in small["error"]
    )
    assert "all near-ties" in small["error"], small["error"]
    assert near["tie-test/small"]["result"] == "PASS"
    assert pd.isna(near["tie-test/small"]["failure_stage"]) and pd.isna(near["tie-test/small"]["error"])

    # The big one: no near-tie by either check, a FAIL in both modes.
    for mode, big in (("exact", exact["tie-test/big"]), ("near-tie", near["tie-test/big"])):
        assert (big["result"], big["failure_stage"], big["first_divergence"], big["near_tie"]) == (
            "FAIL",
            "parity",
            BIG_AT,
            False,
        ), mode
        assert big["logprob_gap"] == pytest.approx(BIG_GAP, abs=1e-5)
        assert (big["positions_disagreeing"], big["first_disagreement"], big["disagreement_rank"]) == (1, BIG_AT, 1)
        assert big["disagreement_deficit"] == pytest.approx(BIG_GAP, abs=1e-5)
        assert big["disagreements_near_tie"] == False  # noqa: E712 (numpy bool)
        assert f"at index {BIG_AT} of {TOKENS}" in big["error"] and f"first at position {BIG_AT} of" in big["error"], (
            big["error"]
        )

    # Both: the free-running comparison stops at its first divergence, the small tie, and near-tie
    # parity accepts that; only the one-core teacher-forced check sees the big miss after it.
    for mode, both in (("exact", exact["tie-test/both"]), ("near-tie", near["tie-test/both"])):
        assert (both["result"], both["failure_stage"], both["first_divergence"], both["near_tie"]) == (
            "FAIL",
            "parity",
            TIE_AT,
            True,
        ), mode
        assert (both["positions_disagreeing"], both["first_disagreement"], both["disagreement_rank"]) == (2, TIE_AT, 1)
        assert both["max_logprob_deficit"] == pytest.approx(BIG_GAP, abs=1e-5)
        assert both["disagreements_near_tie"] == False  # noqa: E712 (numpy bool)
    error = near["tie-test/both"]["error"]
    assert error.startswith(
        f"teacher-forced CPU check: 2 of {TOKENS} device tokens are not the CPU top-1; first at position {TIE_AT} of"
    ), error
    assert "tokens differ from the CPU reference" not in error, error
