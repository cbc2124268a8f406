"""Speech recognition through the plugin as users run it: the tiny zoo's Whisper (an encoder-decoder,
built offline from whisper-tiny.en's config and trained to transcribe run.py's own waveform), checked
token by token as text generation is, a fault planted in its decoder, a decoder prompt the device built
differently (a language it detected), and where the encoder's inputs are put."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest
from faultkit import assert_outcomes, planted_conftest, planted_hub

from pytest_neuron_support import zoo
from pytest_neuron_support.base.storage import slug

WHISPER = zoo.WHISPER_REPO
#: The same checkpoint under other ids, so one session can run it clean and with each planted fault.
PLANTED = "planted/whisper"
LANGUAGE = "planted/whisper-language"
#: The planted fault: the first decoder layer's self-attention output negated, on the device only.
FAULT = "model.model.decoder.layers[0].self_attn.out_proj.weight.mul_(-1.0)"
#: A language the device "detects": on the device only, the English-only checkpoint is made multilingual
#: with English as its one language, so Whisper's generate() runs detect_language on the audio and puts
#: <|en|> (id 770 in the tiny tokenizer) in the decoder prompt; the CPU reference's prompt has none.
DETECTED_LANGUAGE = (
    "model.generation_config.is_multilingual = True\nmodel.generation_config.lang_to_id = {'<|en|>': 770}\n"
)


@pytest.fixture
def whisper_hub(offline_hub: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return planted_hub(offline_hub, tmp_path, monkeypatch, WHISPER, PLANTED, LANGUAGE)


@pytest.mark.usefixtures("eager_compile")
@pytest.mark.slow
def test_the_tiny_whisper_transcribes_its_waveform_and_planted_faults_fail_at_parity_and_at_prompt(
    pytester: pytest.Pytester, whisper_hub: Path
) -> None:
    pytester.makeconftest(
        planted_conftest({LANGUAGE: DETECTED_LANGUAGE, PLANTED: f"with torch.no_grad():\n    {FAULT}\n"})
    )
    task = "automatic-speech-recognition"
    entries = "".join(f"  - {{id: {model}, task: {task}}}\n" for model in (WHISPER, PLANTED, LANGUAGE))
    pytester.makefile(".yaml", models=f"models:\n{entries}")
    result = pytester.runpytest_subprocess("--device=cpu", "-n", "2", "--results-dir=out", "--reference-cache=none")
    assert_outcomes(result, pytester.path / "out", passed=1, failed=2)
    df = pd.read_parquet(pytester.path / "out" / "data").set_index("model_id")

    clean = df.loc[WHISPER]
    assert (clean.result, clean.task, clean.verdict_basis) == ("PASS", task, "parity+teacher-forced")
    # The transcript the tiny model was trained on, ended by the end of text, token for token as the CPU's.
    assert clean.text == " the quick brown fox jumps over a lazy dog." and clean.reference_match
    assert len(clean.tokens) == 11 and clean.matched_prefix == 11 and clean.positions_checked == 11
    assert clean.graphs_compiled >= 1 and clean.repeat_identical and pd.isna(clean.prompt)
    assert "'auto_class': 'AutoModelForSpeechSeq2Seq'" in clean.runscript and "def fixed_audio(" in clean.runscript
    assert '"cache_implementation": "static"' in clean.runscript
    assert tuple(clean.libraries) == (f"transformers=={metadata.version('transformers')}",)

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

    # A language the device detected and the CPU did not: a FAIL at its own stage, naming both prompts.
    language = df.loc[LANGUAGE]
    assert (language.result, language.failure_stage) == ("FAIL", "prompt"), language.error
    assert language.error.startswith(
        "the device's decoder prompt [769 <|startoftranscript|>, 770 <|en|>, 776 <|notimestamps|>] differs from the "
        "CPU reference's [769 <|startoftranscript|>, 776 <|notimestamps|>] at position 1 (device 770 <|en|>, CPU 776 "
        "<|notimestamps|>)"
    ), language.error
    runs = pytester.path / "out" / "runs" / slug(LANGUAGE) / "cpu"
    assert json.loads((runs / "device" / "result.json").read_text())["decoder_prompt_ids"] == [769, 770, 776]
    assert json.loads((runs / "reference" / "result.json").read_text())["decoder_prompt_ids"] == [769, 776]


def audio_fragment(offline_hub: Path) -> dict[str, Any]:
    """The audio fragment's code as run.py holds it (spliced, its SPEC written in), in a namespace of its own."""
    from pytest_neuron_support.run.runscript import _TASK_MARKER, _shared
    from pytest_neuron_support.tasks.speech import AUDIO

    namespace: dict[str, Any] = {"SPEC": {"task_options": {"audio": dict(AUDIO)}}}
    exec(compile(_shared("tasks/audio.py", _TASK_MARKER), "audio.py", "exec"), namespace)
    return namespace


def test_the_encoder_inputs_go_on_the_model_device_in_its_dtype(offline_hub: Path) -> None:
    # The issue: the direct check left input_features on CPU; generate() moves only the decoder's inputs and
    # torch-neuronx's eager path only 0-dim CPU tensors, so Whisper's encoder got a host tensor on trn2. A
    # model on `meta` (every host has it) stands in for one on the device.
    import torch
    from transformers import AutoProcessor

    snapshot = next((offline_hub / f"models--{WHISPER.replace('/', '--')}" / "snapshots").iterdir())
    processor = AutoProcessor.from_pretrained(snapshot)
    model = SimpleNamespace(device=torch.device("meta"), dtype=torch.bfloat16)
    inputs, tokenizer = audio_fragment(offline_hub)["task_inputs"](torch, processor, model)
    features = inputs["input_features"]
    assert (features.device.type, features.dtype) == ("meta", torch.bfloat16)
    assert all(value.device.type == "meta" for value in inputs.values()), {k: v.device for k, v in inputs.items()}
    assert tokenizer is processor.tokenizer
