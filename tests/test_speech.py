"""Speech recognition through the plugin as users run it: the tiny zoo's Whisper (an encoder-decoder,
built offline from whisper-tiny.en's config and trained to transcribe run.py's own waveform), checked
token by token as text generation is, and a fault planted in its decoder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from faultkit import assert_outcomes

from pytest_neuron_support import zoo
from pytest_neuron_support.base.storage import slug

WHISPER = zoo.WHISPER_REPO
#: The same checkpoint under another id, so one session can run it clean and with a planted fault.
PLANTED = "planted/whisper"
#: The planted fault: the first decoder layer's self-attention output negated, on the device only.
FAULT = "model.model.decoder.layers[0].self_attn.out_proj.weight.mul_(-1.0)"


@pytest.fixture
def whisper_hub(offline_hub: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hub"
    shutil.copytree(offline_hub, cache, symlinks=True)
    snapshot = next((cache / f"models--{WHISPER.replace('/', '--')}" / "snapshots").iterdir())
    zoo.install_snapshot(cache, PLANTED, snapshot)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


@pytest.mark.usefixtures("eager_compile")
@pytest.mark.slow
def test_the_tiny_whisper_transcribes_its_waveform_and_a_broken_decoder_fails_at_parity(
    pytester: pytest.Pytester, whisper_hub: Path
) -> None:
    pytester.makeconftest(
        f"""
def pytest_neuron_support_post_load(config, model):
    if model.id != {PLANTED!r}:
        return None
    return "with torch.no_grad():\\n    {FAULT}\\n"
"""
    )
    task = "automatic-speech-recognition"
    pytester.makefile(
        ".yaml", models=f"models:\n  - {{id: {WHISPER}, task: {task}}}\n  - {{id: {PLANTED}, task: {task}}}\n"
    )
    result = pytester.runpytest_subprocess("--device=cpu", "-n", "2", "--results-dir=out", "--reference-cache=none")
    assert_outcomes(result, pytester.path / "out", passed=1, failed=1)
    df = pd.read_parquet(pytester.path / "out" / "data").set_index("model_id")

    clean = df.loc[WHISPER]
    assert (clean.result, clean.task, clean.verdict_basis) == ("PASS", task, "parity+teacher-forced")
    # The transcript the tiny model was trained on, ended by the end of text, token for token as the CPU's.
    assert clean.text == " the quick brown fox jumps over a lazy dog." and clean.reference_match
    assert len(clean.tokens) == 11 and clean.matched_prefix == 11 and clean.positions_checked == 11
    assert clean.graphs_compiled >= 1 and clean.repeat_identical and pd.isna(clean.prompt)
    assert "'auto_class': 'AutoModelForSpeechSeq2Seq'" in clean.runscript and "def fixed_audio(" in clean.runscript
    assert '"cache_implementation": "static"' in clean.runscript

    planted = df.loc[PLANTED]
    assert (planted.result, planted.failure_stage, planted.verdict_basis) == ("FAIL", "parity", "parity+teacher-forced")
    assert planted.first_divergence == 0 and planted.first_disagreement == 0 and not planted.reference_match
    assert "tokens differ from the CPU reference at index 0" in planted.error and FAULT in planted.runscript
    # The teacher-forced check ran on its own (the device's tokens are not the reference's), scoring them
    # after the device run's own decoder prompt (start of transcript, no timestamps).
    runs = pytester.path / "out" / "runs" / slug(PLANTED) / "cpu"
    device = json.loads((runs / "device" / "result.json").read_text())
    check = (runs / "cpu-check" / "run.py").read_text()
    assert planted.cpu_check == "ran" and f"'forced_prefix': {device['decoder_prompt_ids']}" in check
    assert len(device["decoder_prompt_ids"]) == 2
