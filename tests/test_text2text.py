"""Encoder-decoder text generation through the plugin as users run it: the tiny zoo's T5 (built offline from
google-t5/t5-small's config and trained to answer the zoo prompt), checked token by token as text generation
is, with a fault planted in its decoder and a decoder start token the device changed, each on the device only."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from faultkit import assert_outcomes, planted_conftest, planted_hub

from pytest_neuron_support import zoo
from pytest_neuron_support.base.storage import slug

T5 = zoo.SEQ2SEQ_REPO
TASK = "text2text-generation"
#: The same checkpoint under other ids, so one session runs it clean and with each planted fault.
PLANTED = "planted/t5"
START = "planted/t5-start"
#: The planted fault: the first decoder block's self-attention output projection negated, on the device only.
FAULT = "model.decoder.block[0].layer[0].SelfAttention.o.weight.mul_(-1.0)"
#: On the device only, generate() starts the decoder at <s> (id 2) instead of T5's <pad> (id 0).
OTHER_START = "model.generation_config.decoder_start_token_id = 2\n"


@pytest.fixture
def t5_hub(offline_hub: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return planted_hub(offline_hub, tmp_path, monkeypatch, T5, PLANTED, START)


@pytest.mark.usefixtures("eager_compile")
@pytest.mark.slow
def test_the_tiny_t5_answers_its_prompt_and_planted_faults_fail_at_parity_and_at_prompt(
    pytester: pytest.Pytester, t5_hub: Path
) -> None:
    pytester.makeconftest(planted_conftest({START: OTHER_START, PLANTED: f"with torch.no_grad():\n    {FAULT}\n"}))
    entries = "".join(
        f"  - {{id: {model}, task: {TASK}, prompt: {zoo.TINY_PROMPT!r}}}\n" for model in (T5, PLANTED, START)
    )
    pytester.makefile(".yaml", models=f"models:\n{entries}")
    result = pytester.runpytest_subprocess("--device=cpu", "-n", "2", "--results-dir=out", "--reference-cache=none")
    assert_outcomes(result, pytester.path / "out", passed=1, failed=2)
    df = pd.read_parquet(pytester.path / "out" / "data").set_index("model_id")

    clean = df.loc[T5]
    assert (clean.result, clean.task, clean.verdict_basis) == ("PASS", TASK, "parity+teacher-forced")
    # The answer the tiny model was trained on, ended by </s>, token for token as the CPU's; one decoding graph.
    assert clean.text == " the quick brown fox jumps over a lazy dog." and clean.reference_match
    assert len(clean.tokens) == 11 and clean.matched_prefix == 11 and clean.positions_checked == 11
    assert clean.graphs_compiled == 1 and clean.recompiles == 0 and clean.repeat_identical
    assert "'auto_class': 'AutoModelForSeq2SeqLM'" in clean.runscript
    assert '"cache_implementation": "static"' in clean.runscript

    planted = df.loc[PLANTED]
    assert (planted.result, planted.failure_stage, planted.verdict_basis) == ("FAIL", "parity", "parity+teacher-forced")
    # The first token comes through (the tiny model learned it from the encoder); the second does not.
    assert planted.first_divergence == 1 and not planted.reference_match
    assert "tokens differ from the CPU reference at index 1" in planted.error and FAULT in planted.runscript
    # The teacher-forced check ran on its own, scoring the device's tokens after its own decoder prompt.
    runs = pytester.path / "out" / "runs" / slug(PLANTED) / "cpu"
    device = json.loads((runs / "device" / "result.json").read_text())
    assert device["decoder_prompt_ids"] == [0] and planted.cpu_check == "ran"
    assert "'forced_prefix': [0]" in (runs / "cpu-check" / "run.py").read_text()

    # A decoder start the device chose and the CPU did not: a FAIL at its own stage, naming both prompts.
    start = df.loc[START]
    assert (start.result, start.failure_stage) == ("FAIL", "prompt"), start.error
    assert start.error.startswith(
        "the device's decoder prompt [2 <s>] differs from the CPU reference's [0 <pad>] at position 0 (device 2 <s>, "
        "CPU 0 <pad>): generate() started the decoder with another prompt on the device (another start token"
    ), start.error
