"""The text-to-image pipeline: a tiny Stable Diffusion 1.5, built offline from its real component
configs (``model_index.json``, unet, vae, text encoder, tokenizer, scheduler) with only the sizes shrunk
and random weights, saved as diffusers saves a pipeline.

No training: the text-to-image verdict compares noise predictions and images of the same computation on
the device and on CPU, which random weights exercise as well as trained ones (a token verdict needs
decisive logits; a prediction's relative error does not).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pytest_neuron_support.zoo.spec import _PIPELINE_SPEC


def _clip_tokenizer(directory: Path, spec: dict[str, Any]) -> Any:
    """A CLIP BPE tokenizer of its own small vocabulary (every lower-case letter, alone and word-final, and
    the merges of the prompt words the spec lists), written as ``vocab.json`` and ``merges.txt``."""
    from transformers import CLIPTokenizer

    vocab: dict[str, int] = {"<|startoftext|>": 0, "!": 1, "<|endoftext|>": 2}
    for letter in "abcdefghijklmnopqrstuvwxyz":
        vocab[letter] = len(vocab)
        vocab[f"{letter}</w>"] = len(vocab)
    merges = []
    for word in spec["words"]:
        # Left to right, one merge at a time, so the whole word becomes one token (word-final form).
        pieces = [*word[:-1], f"{word[-1]}</w>"]
        while len(pieces) > 1:
            merges.append(f"{pieces[0]} {pieces[1]}")
            pieces = [pieces[0] + pieces[1], *pieces[2:]]
            vocab.setdefault(pieces[0], len(vocab))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (directory / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    return CLIPTokenizer(
        str(directory / "vocab.json"),
        str(directory / "merges.txt"),
        pad_token="<|endoftext|>",
        model_max_length=spec["max_length"],
    )


def _build_pipeline(out_dir: Path, fingerprint: str) -> str:
    """Build, seed and save the tiny pipeline into ``out_dir``; returns its log line's figures."""
    import importlib

    import torch

    # Untyped libraries, used as they are.
    diffusers: Any = importlib.import_module("diffusers")
    transformers: Any = importlib.import_module("transformers")

    spec = _PIPELINE_SPEC
    torch.manual_seed(spec["seed"])
    scratch = out_dir.parent / f"{out_dir.name}-tokenizer"
    tokenizer = _clip_tokenizer(scratch, spec)
    text_config = {**spec["text_encoder"], "vocab_size": len(tokenizer)}
    pipe = diffusers.StableDiffusionPipeline(
        vae=diffusers.AutoencoderKL(**spec["vae"]),
        text_encoder=transformers.CLIPTextModel(transformers.CLIPTextConfig(**text_config)),
        tokenizer=tokenizer,
        unet=diffusers.UNet2DConditionModel(**spec["unet"]),
        scheduler=diffusers.PNDMScheduler(**spec["scheduler"]),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    # diffusers warns at every cast of a model that declares float32 modules, even an empty list of them.
    diffusers.utils.logging.set_verbosity_error()
    pipe.to(torch.bfloat16).save_pretrained(out_dir, safe_serialization=True)
    (out_dir / "README.md").write_text(
        "---\nlibrary_name: diffusers\npipeline_tag: text-to-image\n---\n"
        "# A tiny random Stable Diffusion 1.5\n\nBuilt offline by pytest-neuron-support's tiny zoo from the real "
        f"component configs of {spec['source']} with the sizes shrunk and random weights (bf16).\n\n"
        f"tiny_zoo_fingerprint: {fingerprint}\n",
        encoding="utf-8",
    )
    parameters = sum(p.numel() for module in (pipe.unet, pipe.vae, pipe.text_encoder) for p in module.parameters())
    return f"{parameters} parameters, untrained"
