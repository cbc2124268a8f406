"""The encoder-decoder text model: a tiny T5, built offline from google-t5/t5-small's real config with the
sizes shrunk, the zoo's own tokenizer (whose ``<pad>`` and ``</s>`` sit at T5's ids, 0 and 1), and a short
training run that teaches it to answer the zoo prompt with the zoo's sentence, so greedy decoding is
decisive (the same tokens in fp32 and bf16), as the text models and the tiny Whisper are.
"""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path
from typing import Any

from pytest_neuron_support.zoo.spec import _SEQ2SEQ_SPEC, TINY_PROMPT


def _build_t5(tokenizer_dir: Path, fingerprint: str, out_dir: Path) -> str:
    """Build, train and save the tiny T5 into ``out_dir``; returns its log line's figures. Raises when greedy
    decoding does not give the target in fp32 and bf16 alike."""
    import torch

    transformers: Any = importlib.import_module("transformers")
    spec = _SEQ2SEQ_SPEC
    torch.manual_seed(spec["seed"])
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, out_dir / name)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out_dir))
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id) == (0, 1), "the zoo tokenizer's <pad> and </s> are 0, 1"
    config_fields = {k: v for k, v in spec["config"].items() if k != "model_type"}
    special = {"pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0}
    config = transformers.T5Config(vocab_size=len(tokenizer), **config_fields, **special)
    model = transformers.T5ForConditionalGeneration(config)
    model.generation_config = transformers.GenerationConfig(**special)
    # What run.py feeds the encoder: the prompt as the tokenizer gives it (text.py's task_inputs).
    inputs = tokenizer(TINY_PROMPT, return_tensors="pt")
    target = tokenizer(spec["target"], add_special_tokens=False).input_ids
    expected = [*target, tokenizer.eos_token_id]
    labels = torch.tensor([expected])
    # T5 shifts the labels right after its decoder start token: generate()'s decoder prompt is that one token.
    loss = train_until_decisive(torch, model, "t5", spec, {**inputs, "labels": labels}, dict(inputs), 1, expected)
    save_with_card(
        torch,
        model,
        out_dir,
        "text2text-generation",
        f"# A tiny T5\n\nBuilt offline by pytest-neuron-support's tiny zoo from {spec['source']}'s config with the "
        f"sizes shrunk, trained to answer the zoo prompt with {spec['target']!r} (loss {loss:.4f}).",
        fingerprint,
    )
    return f"loss {loss:.4f}, answer of {len(expected)} tokens in fp32 and bf16"


def train_until_decisive(
    torch: Any,
    model: Any,
    name: str,
    spec: dict[str, Any],
    batch: dict[str, Any],
    inputs: dict[str, Any],
    prefix: int,
    expected: list[int],
) -> float:
    """Train an encoder-decoder on one teacher-forced ``batch`` (``spec``'s steps and learning rate) and return its
    last loss. Raises when greedy decoding of ``inputs`` does not give ``expected`` after the ``prefix`` tokens of
    the decoder prompt, in fp32 and bf16 alike (the tiny T5's and the tiny Whisper's decisiveness)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec["learning_rate"])
    model.train()
    loss = float("nan")
    for _ in range(spec["steps"]):
        out = model(**batch)
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
        loss = float(out.loss.detach())
    model.eval()
    for dtype in (torch.float32, torch.bfloat16):
        given = {k: v.to(dtype) if v.is_floating_point() else v for k, v in inputs.items()}
        with torch.no_grad():
            found = model.to(dtype).generate(**given, max_new_tokens=32, do_sample=False, return_dict_in_generate=True)
        # As run.py reads them: the sequences (Whisper's keep its decoder prompt only there) after the decoder
        # prompt, the end included.
        tokens = [int(t) for t in found.sequences[0, prefix:].tolist()]
        if tokens != expected:
            raise RuntimeError(f"the tiny {name} is not decisive in {dtype}: {tokens} != {expected} (loss {loss:.4f})")
    return loss


def save_with_card(
    torch: Any, model: Any, out_dir: Path, pipeline_tag: str, description: str, fingerprint: str
) -> None:
    """Save the model in bfloat16 with its model card: the Hub's pipeline tag, what it is, the zoo's fingerprint."""
    model.to(torch.bfloat16).save_pretrained(out_dir)
    (out_dir / "README.md").write_text(
        f"---\nlibrary_name: transformers\npipeline_tag: {pipeline_tag}\n---\n{description}\n\n"
        f"tiny_zoo_fingerprint: {fingerprint}\n",
        encoding="utf-8",
    )
