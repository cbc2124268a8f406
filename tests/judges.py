"""Tiny judge checkpoints whose yes/no logits the test controls, built from the tiny zoo's llama.

Every residual branch is zeroed, so the last hidden state depends only on the last prompt
token (fixed by the judge's chat template), whatever text is judged. The output head is then
set so the logit of every "yes" variant is ``yes_logit``, of every "no" variant ``no_logit``,
and of everything else 0: the judge's score is then known in closed form.
"""

from __future__ import annotations

import math
from pathlib import Path


def build_judge(zoo_cache: Path, out: Path, yes_logit: float, no_logit: float) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    repo = zoo_cache / "models--tiny-random--llama"
    snapshot = repo / "snapshots" / (repo / "refs" / "main").read_text().strip()
    tokenizer = AutoTokenizer.from_pretrained(snapshot)
    model = AutoModelForCausalLM.from_pretrained(snapshot, dtype=torch.float32)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": "anything"}], tokenize=False, add_generation_prompt=True
        )
        ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
        hidden = model(**ids, output_hidden_states=True).hidden_states[-1][0, -1]
        unit = hidden / hidden.dot(hidden)
        model.lm_head.weight.zero_()
        for ids_, logit in ((yes_ids(tokenizer), yes_logit), (no_ids(tokenizer), no_logit)):
            for token in ids_:
                model.lm_head.weight[token] = unit * logit
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _first_ids(tokenizer: object, words: list[str]) -> list[int]:
    """First non-blank token of each word, exactly as judge.py picks them."""
    ids = set()
    for word in words:
        for token in tokenizer.encode(word, add_special_tokens=False):  # type: ignore[attr-defined]
            if tokenizer.decode([token]).strip():  # type: ignore[attr-defined]
                ids.add(token)
                break
    return sorted(ids)


def yes_ids(tokenizer: object) -> list[int]:
    return _first_ids(tokenizer, ["yes", "Yes", " yes", " Yes", "YES"])


def no_ids(tokenizer: object) -> list[int]:
    return _first_ids(tokenizer, ["no", "No", " no", " No", "NO"])


def expected_score(n_yes: int, n_no: int, yes_logit: float, no_logit: float) -> float:
    """P(yes | yes or no) when each of n_yes ids has yes_logit and each of n_no ids no_logit."""
    yes = n_yes * math.exp(yes_logit)
    no = n_no * math.exp(no_logit)
    return yes / (yes + no)
