"""The speech recognition model: a tiny Whisper, built offline from openai/whisper-tiny.en's real config
with the sizes shrunk (and 2-second audio windows where Whisper's are 30 s), the zoo's own tokenizer
with Whisper's special tokens, Whisper's feature extractor, and a short training run that teaches it to
transcribe run.py's own test waveform as the zoo's sentence, so greedy decoding is decisive (the same
tokens in fp32 and bf16), as the text models are.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

from pytest_neuron_support.zoo.seq2seq import save_with_card, train_until_decisive
from pytest_neuron_support.zoo.spec import _WHISPER_SPEC


def _test_audio(torch_module: Any) -> Any:
    """run.py's own waveform (its ``fixed_audio``, from the speech task's fragment), synthesised by the
    template's code itself so the zoo trains on exactly the samples every run feeds the model."""
    from pytest_neuron_support.run.runscript import template
    from pytest_neuron_support.tasks.speech import AUDIO

    namespace: dict[str, Any] = {"__name__": "neuron_support_run_template"}
    exec(compile(template("run.py", ("transformers.py", "audio.py", "generation.py")), "run.py", "exec"), namespace)
    namespace["SPEC"] = {"task_options": {"audio": dict(AUDIO)}}
    return namespace["fixed_audio"](torch_module), int(AUDIO["sample_rate"])


def _build_whisper(tokenizer_dir: Path, fingerprint: str, out_dir: Path) -> str:
    """Build, train and save the tiny Whisper into ``out_dir``; returns its log line's figures. Raises when
    greedy decoding does not give the transcript in fp32 and bf16 alike."""
    import torch
    from tokenizers import AddedToken, Tokenizer

    transformers: Any = importlib.import_module("transformers")
    spec = _WHISPER_SPEC
    torch.manual_seed(spec["seed"])
    tokenizer_file = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    tokenizer_file.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in spec["special_tokens"]])
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer_file.save(str(out_dir / "tokenizer.json"))
    ids: dict[str, int] = {}
    for token in spec["special_tokens"]:
        found = tokenizer_file.token_to_id(token)
        assert found is not None, token
        ids[token] = found
    end = "<|endoftext|>"
    tokenizer_config = {
        "tokenizer_class": "WhisperTokenizer",
        "processor_class": "WhisperProcessor",
        "bos_token": end,
        "eos_token": end,
        "pad_token": end,
        "unk_token": end,
        "model_max_length": spec["config"]["max_target_positions"],
        "add_prefix_space": False,
        "errors": "replace",
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n", encoding="utf-8")
    features = transformers.WhisperFeatureExtractor(**spec["feature_extractor"])
    features.save_pretrained(out_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out_dir))
    start, no_timestamps = ids["<|startoftranscript|>"], ids["<|notimestamps|>"]
    special = {
        "decoder_start_token_id": start,
        "eos_token_id": ids[end],
        "pad_token_id": ids[end],
        "bos_token_id": ids[end],
    }
    config = transformers.WhisperConfig(vocab_size=len(tokenizer), **spec["config"], **special)
    model = transformers.WhisperForConditionalGeneration(config)
    model.generation_config = transformers.GenerationConfig(
        **special, no_timestamps_token_id=no_timestamps, is_multilingual=False, max_length=config.max_target_positions
    )
    wave, rate = _test_audio(torch)
    inputs = features(wave.numpy(), sampling_rate=rate, return_tensors="pt").input_features
    target = tokenizer(spec["transcript"], add_special_tokens=False).input_ids
    prompt = [start, no_timestamps]  # what generate() puts before the transcript of an English-only model
    decoder_inputs = torch.tensor([prompt + target])
    labels = torch.tensor([prompt[1:] + target + [ids[end]]])
    expected = [*target, ids[end]]
    batch = {"input_features": inputs, "decoder_input_ids": decoder_inputs, "labels": labels}
    loss = train_until_decisive(torch, model, "whisper", spec, batch, {"input_features": inputs}, len(prompt), expected)
    save_with_card(
        torch,
        model,
        out_dir,
        "automatic-speech-recognition",
        f"# A tiny Whisper\n\nBuilt offline by pytest-neuron-support's tiny zoo from {spec['source']}'s config "
        f"with the sizes shrunk, trained to transcribe run.py's test waveform as {spec['transcript']!r} "
        f"(loss {loss:.4f}).",
        fingerprint,
    )
    return f"loss {loss:.4f}, transcript of {len(expected)} tokens in fp32 and bf16"
