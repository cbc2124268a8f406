"""Verdicts that cannot be fooled, through the plugin as users run it: a sharded model made to write
fluent but wrong text FAILs at parity on the teacher-forced CPU check (the judge, which alone decided
before, still calls it fluent); only when the host cannot hold the model for the CPU check does the
judge decide, and the row says so; a dead model's pad tokens are caught; a warm run that differs from
the first is a FAIL at stage generate."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from faultkit import assert_outcomes, catalog

from pytest_neuron_support import zoo
from pytest_neuron_support.devices.table import DEVICES
from pytest_neuron_support.run.runscript import RunSpec, render
from pytest_neuron_support.tasks.table import task_of

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("eager_compile")]

# Device-side faults, through the post-load hook (written into the device run.py only; never into
# the CPU runs). Each wraps generate() with a logits processor, which sees every decoding step.
FAULTS = '''
PROCESSOR = """
import transformers

tokenizer = transformers.AutoTokenizer.from_pretrained(SPEC["model"])
FOX, DOG = (tokenizer.encode(w, add_special_tokens=False)[-1] for w in (" fox", " dog"))


class Fault(transformers.LogitsProcessor):
    def __init__(self, prompt):
        self.prompt = prompt

    def __call__(self, input_ids, scores):
        step = input_ids.shape[1] - self.prompt
        scores = scores.clone()
        KIND
        return scores


calls = []
original = model.generate


def generate(*args, **kwargs):
    calls.append(1)
    prompt = kwargs["input_ids"].shape[1]
    if WHEN:
        kwargs["logits_processor"] = transformers.LogitsProcessorList([Fault(prompt)])
    return original(*args, **kwargs)


model.generate = generate
"""

# " fox" and " dog" trade places: "the quick brown dog." and on, every word where a fluent text has one.
SWAP = "scores[:, [FOX, DOG]] = scores[:, [DOG, FOX]]"
# A dead model from the fourth token on: all logits equal, so greedy picks id 0, the pad token.
DEAD = "scores[:, :] = scores[:, :] * 0 if step >= 3 else scores"


def fault(kind, when="True"):
    return PROCESSOR.replace("KIND", kind).replace("WHEN", when)


FAULTS = {
    "tiny-random/mistral": fault(SWAP),
    "tiny-random/llama": fault(DEAD),
    # Only the second (warm) generate swaps: what a user gets from the compile cache differs.
    "tiny-random/qwen3": fault(SWAP, when="len(calls) == 2"),
}


def pytest_neuron_support_post_load(config, model):
    return FAULTS.get(model.id)
'''


def _catalog() -> str:
    text = catalog("tiny-random/mistral", "tiny-random/llama", "tiny-random/qwen3")
    for sharded in ("tiny-random/mistral", "tiny-random/llama"):
        text = text.replace(f"{{id: {sharded},", f"{{id: {sharded}, cores: 2,")
    return "judge: {model: tiny-random/judge}\n" + text


def _rows(pytester: pytest.Pytester, results: str) -> pd.DataFrame:
    return pd.read_parquet(pytester.path / results / "data").set_index("model_id")


def test_fluent_wrong_dead_and_warm_faults_fail_on_cpu_evidence(pytester: pytest.Pytester, offline_hub: Path) -> None:
    pytester.makeconftest(FAULTS)
    pytester.makefile(".yaml", models=_catalog())
    result = pytester.runpytest_subprocess(
        "--device=cpu", "-n", "2", "--neuron-cores=2", "--results-dir=out", "--reference-cache=refs"
    )
    assert_outcomes(result, pytester.path / "out", failed=3)
    # The suite's verdict is a plain assert; pytest's explanation of it is the row's evidence.
    result.stdout.fnmatch_lines(
        [
            "*test_model[[]tiny-random/mistral[]]*",
            "E * assert 'FAIL' == 'PASS'",
            "E *tiny-random/mistral: FAIL at stage parity, decided by teacher-forced",
            "E *teacher-forced: 6 of 32 device tokens are not the CPU top-1; matched prefix 3; first divergence at "
            "index 3: device 523 (CPU rank *) != CPU top-1 455, * nats below",
            "E *- CPU top-1 [[]285, 349, 381, 455]",
            "E *+ device    [[]285, 349, 381, 523, *]",
            "E *run.py, result.json and log.txt: */out/runs/tiny-random--mistral/cpu",
        ],
        consecutive=False,
    )
    df = _rows(pytester, "out")

    fluent = df.loc["tiny-random/mistral"]
    # The text reads as English, and the judge says so: on the judge alone this run PASSed.
    assert fluent.text.startswith(" the quick brown dog."), fluent.text
    assert fluent.judge_verdict == "fluent" and fluent.judge_score >= 0.5, (fluent.judge_verdict, fluent.judge_score)
    # The CPU check, one forward over prompt + device tokens, finds the first swapped token.
    assert (fluent.result, fluent.failure_stage, fluent.verdict_basis) == ("FAIL", "parity", "teacher-forced")
    assert fluent.cpu_check == "ran" and fluent.positions_checked == 32
    assert fluent.first_disagreement == 3  # " the quick brown" then " dog" where the CPU says " fox"
    assert (fluent.disagreement_device_token, fluent.disagreement_cpu_token) == (523, 455)
    assert fluent.disagreement_rank > 0 and fluent.disagreement_deficit > 2.0  # the zoo is decisive
    assert fluent.positions_disagreeing >= 6 and fluent.disagreements_near_tie is False
    assert "position 3 of 32" in fluent.error and "not the CPU top-1" in fluent.error

    dead = df.loc["tiny-random/llama"]
    assert (dead.result, dead.failure_stage, dead.verdict_basis) == ("FAIL", "parity", "teacher-forced")
    assert dead.first_disagreement == 3 and list(dead.tokens[3:]) == [0] * 29
    # The judge's text skips the pad tokens; the precheck sees them.
    assert dead.judge_verdict.startswith("precheck: 29 of 32 generated tokens are special tokens"), dead.judge_verdict

    warm = df.loc["tiny-random/qwen3"]
    assert (warm.result, warm.failure_stage, warm.verdict_basis) == ("FAIL", "generate", "repeat")
    assert warm.repeat_identical is False or warm.repeat_identical == False  # noqa: E712 (numpy bool)
    assert warm.repeat_divergence == 3 and "position 3 of 32 (first 455, second 523)" in warm.error


def test_without_room_for_the_cpu_check_the_judge_decides_and_the_row_says_so(
    pytester: pytest.Pytester, offline_hub: Path
) -> None:
    pytester.makeconftest(FAULTS)
    pytester.makefile(".yaml", models=_catalog().split("  - {id: tiny-random/llama")[0])
    result = pytester.runpytest_subprocess(
        "--device=cpu", "--neuron-cores=2", "--results-dir=out", "--cpu-check-memory-gib=0.000001"
    )
    assert_outcomes(result, pytester.path / "out", passed=1)
    row = _rows(pytester, "out").loc["tiny-random/mistral"]
    # What today's judge-only verdict gives the same fluent-but-wrong run: PASS, honestly labelled.
    assert (row.result, row.verdict_basis, row.judge_verdict) == ("PASS", "judge", "fluent")
    assert row.cpu_check.startswith("skipped: needs ~") and "--cpu-check-memory-gib allows 0.0 GiB" in row.cpu_check
    assert pd.isna(row.positions_checked)


def _run(spec: RunSpec, directory: Path) -> dict[str, Any]:
    directory.mkdir(parents=True)
    script = directory / "run.py"
    script.write_text(render(spec))
    proc = subprocess.run(
        [sys.executable, str(script), "--out", "result.json"],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result: dict[str, Any] = json.loads((directory / "result.json").read_text())
    return result


@pytest.mark.parametrize(
    ("model", "task"), [("tiny-random/qwen3", "text-generation"), ("tiny-random/llava", "image-text-to-text")]
)
def test_the_cpu_check_scores_given_tokens_under_their_own_prefix(
    offline_hub: Path, tmp_path: Path, model: str, task: str
) -> None:
    """run.py's teacher-forced mode, on real checkpoints (the VLM with its image): a reference that
    scores its own greedy tokens finds every one its top-1; the same tokens with one replaced are
    scored again in one forward, and exactly the replaced one (and what follows under the changed
    prefix, if anything) disagrees, with its rank and deficit."""
    cpu = DEVICES["cpu"]
    common: dict[str, Any] = dict(
        model=model,
        revision="main",
        task=task,
        dtype="float32",
        prompt=zoo.TINY_PROMPT,
        max_new_tokens=12,
        device=cpu,
        compile=False,
        compile_backend="inductor",
        **task_of(task).script_fields(),
    )
    reference = _run(RunSpec(**common, score_own_tokens=True), tmp_path / "reference")
    tokens = reference["tokens"]
    assert len(reference["forced"]) == len(tokens) == 12
    assert all(
        p["rank"] == 0 and p["deficit"] == 0.0 and p["token"] == t
        for p, t in zip(reference["forced"], tokens, strict=True)
    )

    replaced = list(tokens)
    second_best = reference["top_logprobs"][5]["ids"][1]
    replaced[5] = second_best
    checked = _run(RunSpec(**common, forced_tokens=tuple(replaced)), tmp_path / "check")
    positions = checked["forced"]
    assert checked["tokens"] == [] and [p["token"] for p in positions] == replaced
    assert all(p["rank"] == 0 for p in positions[:5])  # the same prefix scores the same
    assert (positions[5]["rank"], positions[5]["top1"]) == (1, tokens[5])
    # The deficit is the reference's own gap between its top-1 and top-2 there (same weights, same prefix).
    gap = reference["top_logprobs"][5]["logprobs"][0] - reference["top_logprobs"][5]["logprobs"][1]
    assert positions[5]["deficit"] == pytest.approx(gap, abs=1e-3) and positions[5]["deficit"] > 1.0
