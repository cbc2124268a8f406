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
    labels = torch.tensor([[*target, tokenizer.eos_token_id]])
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec["learning_rate"])
    model.train()
    loss = float("nan")
    for _ in range(spec["steps"]):
        out = model(**inputs, labels=labels)  # T5 shifts the labels right after its decoder start token
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
        loss = float(out.loss.detach())
    model.eval()
    expected = [*target, tokenizer.eos_token_id]
    for dtype in (torch.float32, torch.bfloat16):
        with torch.no_grad():
            found = model.to(dtype).generate(**inputs, max_new_tokens=32, do_sample=False)
        # As run.py reads them: the sequence after the decoder prompt (the start token), the end included.
        tokens = [int(t) for t in found[0, 1:].tolist()]
        if tokens != expected:
            raise RuntimeError(f"the tiny t5 is not decisive in {dtype}: {tokens} != {expected} (loss {loss:.4f})")
    model.to(torch.bfloat16).save_pretrained(out_dir)
    (out_dir / "README.md").write_text(
        "---\nlibrary_name: transformers\npipeline_tag: text2text-generation\n---\n"
        f"# A tiny T5\n\nBuilt offline by pytest-neuron-support's tiny zoo from {spec['source']}'s config with "
        f"the sizes shrunk, trained to answer the zoo prompt with {spec['target']!r} (loss {loss:.4f}).\n\n"
        f"tiny_zoo_fingerprint: {fingerprint}\n",
        encoding="utf-8",
    )
    return f"loss {loss:.4f}, answer of {len(expected)} tokens in fp32 and bf16"
