"""Decisiveness check: whether an installed checkpoint still decodes the prompt decisively."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pytest_neuron_support.zoo.spec import ARCHS, TINY_PROMPT
from pytest_neuron_support.zoo.text import _greedy, _quiet_transformers, _single_thread, _transformers
from pytest_neuron_support.zoo.vlm import _vlm_inputs


@dataclass(frozen=True)
class DecisiveReport:
    """Result of :func:`check_decisive`.

    Attributes:
        repo_id: the checked repo.
        prompt: the prompt decoded from.
        tokens: new token ids per mode: ``"fp32_eager"``, ``"bf16_eager"``, ``"bf16_compiled"`` (static
            cache + ``torch.compile`` inductor decoding).
        identical: all modes produced the same tokens.
        min_top2_gap: smallest top-1 minus top-2 logit over all decoded positions, over the fp32 and the
            bf16 eager runs.
        text: the fp32 continuation, decoded.
        compiled_graphs: graphs torch.compile captured during the compiled run (0 would mean generate
            silently fell back to eager decoding).
    """

    repo_id: str
    prompt: str
    tokens: Mapping[str, tuple[int, ...]] = field(hash=False)
    identical: bool
    min_top2_gap: float
    text: str
    compiled_graphs: int


def check_decisive(
    cache_dir: Path, repo_id: str, prompt: str = TINY_PROMPT, max_new_tokens: int = 32
) -> DecisiveReport:
    """Load ``repo_id`` offline from the Hub cache ``cache_dir`` and greedy-decode ``max_new_tokens``
    tokens of ``prompt`` in fp32 eager, bf16 eager and bf16 with compiled (static cache, inductor)
    decoding.  Resets torch._dynamo before compiling.  A vision-language repo is decoded as run.py
    runs it: its processor's chat template around the test card and the prompt.  Decodes on one
    intra-op thread, as the builder trained and checked it (``_single_thread``)."""
    import torch

    tf = _transformers()
    load = {"cache_dir": str(cache_dir), "local_files_only": True}
    vision = any(a.repo_id == repo_id and a.task == "image-text-to-text" for a in ARCHS)
    auto = tf.AutoModelForImageTextToText if vision else tf.AutoModelForCausalLM
    if vision:
        processor = tf.AutoProcessor.from_pretrained(repo_id, **load)
        tokenizer = processor.tokenizer
        enc = _vlm_inputs(processor, prompt, torch.float32)
    else:
        tokenizer = tf.AutoTokenizer.from_pretrained(repo_id, **load)
        enc = tokenizer(prompt, return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"]

    def extra(dtype: Any) -> dict[str, Any]:
        return {"pixel_values": enc["pixel_values"].to(dtype)} if vision else {}

    tokens: dict[str, tuple[int, ...]] = {}
    with _quiet_transformers(), _single_thread():
        model = auto.from_pretrained(repo_id, dtype=torch.float32, **load).eval()
        tokens["fp32_eager"], gap32 = _greedy(model, ids, mask, max_new_tokens, extra=extra(torch.float32))
        model = auto.from_pretrained(repo_id, dtype=torch.bfloat16, **load).eval()
        tokens["bf16_eager"], gap16 = _greedy(model, ids, mask, max_new_tokens, extra=extra(torch.bfloat16))
        torch._dynamo.reset()
        counters = torch._dynamo.utils.counters
        counters.clear()
        tokens["bf16_compiled"], _ = _greedy(
            model, ids, mask, max_new_tokens, compile_decoding=True, extra=extra(torch.bfloat16)
        )
        graphs = int(counters["stats"]["unique_graphs"])
        torch._dynamo.reset()
    reference = tokens["fp32_eager"]
    return DecisiveReport(
        repo_id=repo_id,
        prompt=prompt,
        tokens=MappingProxyType(tokens),
        identical=all(t == reference for t in tokens.values()),
        min_top2_gap=min(gap32, gap16),
        text=str(tokenizer.decode(list(reference))),
        compiled_graphs=graphs,
    )
