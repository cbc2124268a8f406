"""README promises that only a real run can keep: --device auto picks what torch sees (cpu here),
a plan that needs more cores than allowed is a SKIPPED row at stage plan, --resume reruns a
model whose settings changed, and --parity near-tie passes a real near-tie that exact parity fails."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from faultkit import assert_outcomes, catalog

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


# A natural near-tie of the tiny zoo, found by searching prompts (nothing planted): tiny-random/llama
# in bfloat16 on this prompt picks token 381 at index 1 in the eager CPU reference, while the
# compiled (inductor) device run picks 378, one bf16 logit step (2**-4 = 0.0625 nats) below 381 in
# the reference's distribution and tied with it in the device's own. It diverges at index 1 for every
# --max-new-tokens from 2 to 10. float32 has no such near-tie: there, compiled and eager logprobs
# differ by ~4e-6 nats. A rebuilt zoo (new fingerprint) has other weights and needs a new prompt.
NEAR_TIE_PROMPT = "Repeat after me: across carries busy."
NEAR_TIE_EVIDENCE = {
    "verdict_basis": "parity+teacher-forced",
    "dtype": "bfloat16",
    "reference_dtype": "bfloat16",
    "repeat_identical": True,
    "reference_match": False,
    "near_tie": True,
    "matched_prefix": 1,
    "first_divergence": 1,
    "device_token": 378,
    "reference_token": 381,
    "logprob_gap": 0.0625,
    "cpu_check": "ran",
    "positions_checked": 4,
    "positions_disagreeing": 1,  # past the divergence the device's own tokens are the CPU's top-1
    "first_disagreement": 1,
    "disagreement_device_token": 378,
    "disagreement_cpu_token": 381,
    "disagreement_rank": 1,
    "disagreement_deficit": 0.0625,
    "max_logprob_deficit": 0.0625,
    "disagreements_near_tie": True,
}


def test_near_tie_parity_passes_a_real_near_tie_that_exact_parity_fails(
    pytester: pytest.Pytester, offline_hub: Path
) -> None:
    entry = f"{{id: tiny-random/llama, task: text-generation, dtype: bfloat16, prompt: {json.dumps(NEAR_TIE_PROMPT)}}}"
    pytester.makefile(".yaml", models=f"models:\n  - {entry}\n")
    # 4 tokens: the divergence at index 1 and two device tokens after it for the teacher-forced check.
    # No reference cache: each session runs its own CPU reference and check, so neither verdict
    # rests on evidence the other session left behind.
    args = ("--device=cpu", "--max-new-tokens=4", "--reference-cache=none", "-p", "no:cacheprovider")
    rows: dict[str, dict[str, Any]] = {}
    for parity, outcome in (("exact", {"failed": 1}), ("near-tie", {"passed": 1})):
        result = pytester.runpytest_subprocess(*args, f"--results-dir={parity}", f"--parity={parity}")
        [rows[parity]] = pd.read_parquet(pytester.path / parity / "data").to_dict("records")
        if parity == "exact" and rows[parity]["result"] == "PASS" and rows[parity]["reference_match"]:
            # The tie is one bf16 step: a CPU whose vector kernels round the other way (another
            # instruction set) gives the CPU's token. That is no near-tie to test, not a pass of it.
            pytest.skip(f"no near-tie on this CPU: compiled and eager agree on {NEAR_TIE_PROMPT!r}")
        assert_outcomes(result, pytester.path / parity, **outcome)
        evidence = {key: rows[parity][key] for key in NEAR_TIE_EVIDENCE}
        assert evidence == NEAR_TIE_EVIDENCE, (parity, evidence, rows[parity]["error"])
    exact, near = rows["exact"], rows["near-tie"]
    assert (exact["result"], exact["failure_stage"]) == ("FAIL", "parity")
    assert "index 1 of 4 (device 378, reference 381, gap 0.0625 nats, a near-tie)" in exact["error"], exact["error"]
    assert "all near-ties" in exact["error"], exact["error"]
    assert near["result"] == "PASS"
    assert pd.isna(near["failure_stage"]) and pd.isna(near["error"]), near["error"]
    # The same device tokens both times: the verdicts differ by the mode alone.
    assert list(near["tokens"]) == list(exact["tokens"]) and list(exact["reference_tokens"])[1] == 381
