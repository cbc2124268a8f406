"""What defines the tiny zoo: its architectures (real Hub configs, shrunk), tokenizer and corpus,
training recipes (text models, the VLM, the judge), the prompt, and the fingerprint of all of them.

Everything a build depends on lives here, so :func:`zoo_fingerprint` can hash it in one place."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

# transformers' own annotations are partial (untyped calls everywhere), so its objects are handled as Any.
_HFModel = Any
_HFTokenizer = Any

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
    from pytest_neuron_support.verdict.fluency import JUDGE_QUESTION

    return JUDGE_QUESTION


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


def _installed(distribution: str) -> str:
    """The installed version of ``distribution`` (metadata only: nothing is imported), or ``none``."""
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "none"


#: The tiny text-to-image pipeline (zoo/diffusion.py): stable-diffusion-v1-5's component configs, their
#: behaviour kept (activations, attention layout, block types, the VAE's four blocks, so a latent is an
#: eighth of the image as in SD) and the sizes shrunk (a two-level UNet where SD has four; 32 channels
#: where it has 320; a 2-layer CLIP text encoder). One departure: the scheduler predicts v (as Stable
#: Diffusion 2's does) instead of SD 1.5's noise, because a few seconds of training teach a v-predicting
#: UNet a picture that 4 steps draw from any noise, and an epsilon one only from some (see "pictures").
PIPELINE_REPO = f"{ZOO_ORG}/stable-diffusion"
_PIPELINE_SPEC: dict[str, Any] = {
    "source": "stable-diffusion-v1-5/stable-diffusion-v1-5",
    "seed": 1505,
    "max_length": 77,
    # The words the tokenizer merges whole (the image prompt's; others split into letters).
    "words": ["a", "red", "apple", "on", "wooden", "table", "studio", "light"],
    # What it is trained to draw, at the suite's 64x64 (colours RGB in [0, 1]; lengths fractions of the
    # side): on the scene's backdrop, a band below `band_top` and a disc of the picture's colour (if any)
    # of `radius`, centred across and at `disc_y` down. The suite's prompt (tasks/text_to_image.py
    # IMAGE_PROMPT; tests/test_zoo.py checks) is a red apple on a wooden table, and the empty prompt, which
    # classifier-free guidance subtracts, the same table without it, so guidance adds the apple and nothing
    # else. Each further caption costs far more than its share: four captions (colours and shapes) took
    # 300 steps, 28 CPU-s, and still drew a green apple red.
    "pictures": {
        "A red apple on a wooden table, studio light": {"disc": [0.85, 0.1, 0.1]},
        "": {"disc": None},
    },
    "scene": {
        "backdrop": [0.85, 0.85, 0.8],
        "band": [0.55, 0.35, 0.18],
        "band_top": 0.62,
        "radius": 0.22,
        "disc_y": 0.53,
    },
    # The suite's step count (tasks/text_to_image.py OPTIONS): half of each batch is at its timesteps.
    "sampling_steps": 4,
    "training": {"vae_steps": 100, "vae_lr": 5e-3, "latent_noise": 0.1, "unet_steps": 100, "batch": 8, "lr": 3e-3},
    "unet": {
        "act_fn": "silu",
        "attention_head_dim": 8,
        "block_out_channels": (32, 64),
        "center_input_sample": False,
        "cross_attention_dim": 32,
        "down_block_types": ("CrossAttnDownBlock2D", "DownBlock2D"),
        "downsample_padding": 1,
        "flip_sin_to_cos": True,
        "freq_shift": 0,
        "in_channels": 4,
        "layers_per_block": 1,
        "mid_block_scale_factor": 1,
        "norm_eps": 1e-05,
        "norm_num_groups": 8,
        "out_channels": 4,
        # 8 latents x the VAE's factor of 8: the 64x64 the suite draws is the pipeline's own default.
        "sample_size": 8,
        "up_block_types": ("UpBlock2D", "CrossAttnUpBlock2D"),
    },
    "vae": {
        "act_fn": "silu",
        "block_out_channels": (8, 16, 32, 32),
        "down_block_types": ("DownEncoderBlock2D",) * 4,
        "in_channels": 3,
        "latent_channels": 4,
        "layers_per_block": 1,
        "norm_num_groups": 8,
        "out_channels": 3,
        "sample_size": 64,
        "up_block_types": ("UpDecoderBlock2D",) * 4,
        "scaling_factor": 0.18215,
    },
    "text_encoder": {
        "hidden_act": "quick_gelu",
        "hidden_size": 32,
        "intermediate_size": 64,
        "max_position_embeddings": 77,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "layer_norm_eps": 1e-05,
        "projection_dim": 32,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "pad_token_id": 1,
    },
    "scheduler": {
        "beta_end": 0.012,
        "beta_schedule": "scaled_linear",
        "beta_start": 0.00085,
        "num_train_timesteps": 1000,
        "set_alpha_to_one": False,
        "skip_prk_steps": True,
        "steps_offset": 1,
        "prediction_type": "v_prediction",
    },
}


#: The tiny speech recognition model (zoo/speech.py): openai/whisper-tiny.en's config, its behaviour kept
#: (activation, mel bins, English-only generation) and the sizes shrunk, with 2-second audio windows (100
#: encoder positions) where Whisper's are 30 s (1500), so the encoder costs little.
WHISPER_REPO = f"{ZOO_ORG}/whisper"
_WHISPER_SPEC: dict[str, Any] = {
    "source": "openai/whisper-tiny.en",
    "seed": 1750,
    "steps": 100,
    "learning_rate": 3e-3,
    "transcript": " the quick brown fox jumps over a lazy dog.",
    "special_tokens": [
        "<|endoftext|>",
        "<|startoftranscript|>",
        "<|en|>",
        "<|transcribe|>",
        "<|translate|>",
        "<|startoflm|>",
        "<|startofprev|>",
        "<|nocaptions|>",
        "<|notimestamps|>",
    ],
    "config": {
        "num_mel_bins": 80,
        "d_model": 64,
        "encoder_layers": 2,
        "encoder_attention_heads": 4,
        "decoder_layers": 2,
        "decoder_attention_heads": 4,
        "encoder_ffn_dim": 128,
        "decoder_ffn_dim": 128,
        "activation_function": "gelu",
        "max_source_positions": 100,
        "max_target_positions": 448,
        "scale_embedding": False,
        "begin_suppress_tokens": None,
        "suppress_tokens": None,
    },
    "feature_extractor": {
        "feature_size": 80,
        "sampling_rate": 16000,
        "hop_length": 160,
        "chunk_length": 2,
        "n_fft": 400,
    },
}


#: The tiny encoder-decoder (zoo/seq2seq.py): google-t5/t5-small's config with the sizes shrunk, the zoo's own
#: tokenizer (its ``<pad>`` and ``</s>`` are T5's ids 0 and 1: the decoder start and the end), trained to answer
#: :data:`TINY_PROMPT` on the encoder side with ``target``, decisively in fp32 and bf16.
SEQ2SEQ_REPO = f"{ZOO_ORG}/t5"
_SEQ2SEQ_SPEC: dict[str, Any] = {
    "source": "google-t5/t5-small",
    "seed": 1751,
    "steps": 120,
    "learning_rate": 3e-3,
    "target": f" {_PROMPT_SENTENCE}",
    "config": {
        "model_type": "t5",
        "architectures": ["T5ForConditionalGeneration"],
        "d_model": 64,
        "d_kv": 16,
        "d_ff": 128,
        "num_layers": 2,
        "num_decoder_layers": 2,
        "num_heads": 4,
        "relative_attention_num_buckets": 32,
        "relative_attention_max_distance": 128,
        "dropout_rate": 0.1,
        "feed_forward_proj": "relu",
        "layer_norm_epsilon": 1e-06,
        "initializer_factor": 1.0,
        "tie_word_embeddings": True,
    },
}


#: The forward tasks' models (zoo/forward.py), one per task: a real Hub checkpoint's config with the sizes
#: shrunk, the zoo's tokenizer with a mask token and RoBERTa's ``<s> ... </s>`` framing, trained for a few
#: seconds on run.py's own sentences (tasks/forward.py) so every decision is decisive: each sentence's
#: label (``labels``), each word-piece's tag (its token id modulo the label count: a rule the tiny model
#: learns from its embeddings), or the word at each mask (``words``, the first word-piece of each); an image or
#: audio classifier takes the checkpoint's own preprocessor (``preprocessor``) and labels each input.
_BERT_DROPOUT = {"attention_probs_dropout_prob": 0.1, "hidden_dropout_prob": 0.1, "initializer_range": 0.02}
#: The ImageNet normalisation most image processors of the checkpoints below ship with.
_IMAGENET_NORMALIZE = {"do_normalize": True, "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}
#: wav2vec2-base's feature extractor and its config with the sizes shrunk: the audio rows' common part.
_WAV2VEC2_FEATURES = {
    "class": "Wav2Vec2FeatureExtractor",
    "feature_size": 1,
    "sampling_rate": 16000,
    "padding_value": 0.0,
    "do_normalize": True,
    "return_attention_mask": False,
}
#: wav2vec2-base-960h's vocabulary in id order: its CTC blank (``<pad>``), specials, word delimiter, characters.
_CTC_CHARACTERS = ("<pad>", "<s>", "</s>", "<unk>", "|", *"ETAONIHSRDLUMWCFGYPBVK'XJQZ")
_WAV2VEC2_BASE = {
    "model_type": "wav2vec2",
    "activation_dropout": 0.0,
    "apply_spec_augment": False,
    "attention_dropout": 0.0,
    "conv_bias": False,
    "conv_dim": [32] * 7,
    "conv_kernel": [10, 3, 3, 3, 3, 2, 2],
    "conv_stride": [5, 2, 2, 2, 2, 2, 2],
    "do_stable_layer_norm": False,
    "feat_extract_activation": "gelu",
    "feat_extract_norm": "group",
    "feat_proj_dropout": 0.0,
    "final_dropout": 0.0,
    "hidden_act": "gelu",
    "hidden_dropout": 0.0,
    "hidden_size": _HIDDEN,
    "intermediate_size": _INTER,
    "layer_norm_eps": 1e-05,
    "layerdrop": 0.0,
    "num_attention_heads": _HEADS,
    "num_conv_pos_embedding_groups": 4,
    "num_conv_pos_embeddings": 16,
    "num_feat_extract_layers": 7,
    "num_hidden_layers": _LAYERS,
}
_FORWARD_SPECS: dict[str, dict[str, Any]] = {
    "distilbert-sst2": {
        "task": "text-classification",
        "source": "distilbert/distilbert-base-uncased-finetuned-sst-2-english",
        "auto_class": "DistilBertForSequenceClassification",
        "labels": [1, 1, 0, 0, 0, 1],
        "config": {
            "architectures": ["DistilBertForSequenceClassification"],
            "model_type": "distilbert",
            "activation": "gelu",
            "attention_dropout": 0.1,
            "dim": _HIDDEN,
            "dropout": 0.1,
            "finetuning_task": "sst-2",
            "hidden_dim": _INTER,
            "id2label": {"0": "NEGATIVE", "1": "POSITIVE"},
            "label2id": {"NEGATIVE": 0, "POSITIVE": 1},
            "initializer_range": 0.02,
            "max_position_embeddings": 66,
            "n_heads": _HEADS,
            "n_layers": _LAYERS,
            "qa_dropout": 0.1,
            "seq_classif_dropout": 0.2,
            "sinusoidal_pos_embds": False,
            "tie_weights_": True,
        },
    },
    "distilbert-mnli": {
        "task": "zero-shot-classification",
        "source": "typeform/distilbert-base-uncased-mnli",
        "auto_class": "DistilBertForSequenceClassification",
        # Each (sentence, hypothesis) pair's NLI class, sentence by sentence, label by label (tasks/forward.py's
        # ZERO_SHOT_SENTENCES x CANDIDATE_LABELS): 0 entailment, 1 neutral, 2 contradiction.
        "labels": [2, 2, 0, 0, 2, 1, 1, 0, 2],
        "config": {
            "architectures": ["DistilBertForSequenceClassification"],
            "model_type": "distilbert",
            "activation": "gelu",
            "attention_dropout": 0.1,
            "dim": _HIDDEN,
            "dropout": 0.1,
            "hidden_dim": _INTER,
            "id2label": {"0": "ENTAILMENT", "1": "NEUTRAL", "2": "CONTRADICTION"},
            "label2id": {"ENTAILMENT": 0, "NEUTRAL": 1, "CONTRADICTION": 2},
            "initializer_range": 0.02,
            "max_position_embeddings": 66,
            "n_heads": _HEADS,
            "n_layers": _LAYERS,
            "qa_dropout": 0.1,
            "seq_classif_dropout": 0.2,
            "sinusoidal_pos_embds": False,
            "tie_weights_": True,
        },
    },
    "bert-ner": {
        "task": "token-classification",
        "source": "dslim/bert-base-NER",
        "auto_class": "BertForTokenClassification",
        "config": {
            "architectures": ["BertForTokenClassification"],
            "model_type": "bert",
            **_BERT_DROPOUT,
            "hidden_act": "gelu",
            "hidden_size": _HIDDEN,
            "id2label": {
                str(i): label
                for i, label in enumerate(
                    ["O", "B-MISC", "I-MISC", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC"]
                )
            },
            "intermediate_size": _INTER,
            "layer_norm_eps": 1e-12,
            "max_position_embeddings": 66,
            "num_attention_heads": _HEADS,
            "num_hidden_layers": _LAYERS,
            "position_embedding_type": "absolute",
            "type_vocab_size": 2,
        },
    },
    "roberta": {
        "task": "fill-mask",
        "source": "FacebookAI/roberta-base",
        "auto_class": "RobertaForMaskedLM",
        "words": [" dog", " Paris", " wonderful", " password"],
        "config": {
            "architectures": ["RobertaForMaskedLM"],
            "model_type": "roberta",
            **_BERT_DROPOUT,
            "hidden_act": "gelu",
            "hidden_size": _HIDDEN,
            "intermediate_size": _INTER,
            "layer_norm_eps": 1e-05,
            "max_position_embeddings": 66,
            "num_attention_heads": _HEADS,
            "num_hidden_layers": _LAYERS,
            "type_vocab_size": 1,
        },
    },
    "vit": {
        "task": "image-classification",
        "source": "google/vit-base-patch16-224",
        "auto_class": "ViTForImageClassification",
        "labels": [0, 1],  # the test card, its mirror image
        "preprocessor": {
            "class": "ViTImageProcessor",
            "do_resize": True,
            "size": {"height": 64, "width": 64},
            "do_normalize": True,
            "image_mean": [0.5, 0.5, 0.5],
            "image_std": [0.5, 0.5, 0.5],
            "resample": 2,
        },
        "config": {
            "architectures": ["ViTForImageClassification"],
            "model_type": "vit",
            "attention_probs_dropout_prob": 0.0,
            "hidden_act": "gelu",
            "hidden_dropout_prob": 0.0,
            "hidden_size": _HIDDEN,
            "id2label": {"0": "tench, Tinca tinca", "1": "goldfish, Carassius auratus", "2": "great white shark"},
            "image_size": 64,
            "initializer_range": 0.02,
            "intermediate_size": _INTER,
            "layer_norm_eps": 1e-12,
            "num_attention_heads": _HEADS,
            "num_channels": 3,
            "num_hidden_layers": _LAYERS,
            "patch_size": 16,
            "qkv_bias": True,
        },
    },
    "wav2vec2-ks": {
        "task": "audio-classification",
        "source": "superb/wav2vec2-base-superb-ks",
        "auto_class": "Wav2Vec2ForSequenceClassification",
        "labels": [0, 1],  # the waveform, the same samples reversed
        "preprocessor": _WAV2VEC2_FEATURES,
        "config": {
            **_WAV2VEC2_BASE,
            "architectures": ["Wav2Vec2ForSequenceClassification"],
            "classifier_proj_size": 32,
            "id2label": {
                str(i): label
                for i, label in enumerate(
                    ["yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go", "_silence_", "_unknown_"]
                )
            },
            "use_weighted_layer_sum": True,
        },
    },
    "wav2vec2-ctc": {
        "task": "automatic-speech-recognition-ctc",
        "source": "facebook/wav2vec2-base-960h",
        "auto_class": "Wav2Vec2ForCTC",
        "processor": "Wav2Vec2Processor",
        "preprocessor": _WAV2VEC2_FEATURES,
        # wav2vec2-base-960h's characters, the pad token its CTC blank; each frame's character is labelled.
        "vocab": {
            "class": "Wav2Vec2CTCTokenizer",
            "tokens": list(_CTC_CHARACTERS),
            "special": {"pad_token": "<pad>", "unk_token": "<unk>", "word_delimiter_token": "|"},
        },
        "config": {
            **_WAV2VEC2_BASE,
            "architectures": ["Wav2Vec2ForCTC"],
            "ctc_loss_reduction": "sum",
            "pad_token_id": 0,
            "vocab_size": 32,
            "id2label": {str(i): token for i, token in enumerate(_CTC_CHARACTERS)},
        },
    },
    "clip": {
        "task": "zero-shot-image-classification",
        "source": "openai/clip-vit-base-patch32",
        "auto_class": "CLIPModel",
        "labels": [0, 1],  # the test card: "a test card"; its mirror image: "a mirrored test card"
        "processor": "CLIPProcessor",
        "preprocessor": {
            "class": "CLIPImageProcessor",
            "do_resize": True,
            "size": {"shortest_edge": 32},
            "do_center_crop": True,
            "crop_size": {"height": 32, "width": 32},
            "do_normalize": True,
            "image_mean": [0.48145466, 0.4578275, 0.40821073],
            "image_std": [0.26862954, 0.26130258, 0.27577711],
            "resample": 3,
        },
        "config": {
            "architectures": ["CLIPModel"],
            "model_type": "clip",
            "logit_scale_init_value": 2.6592,
            "projection_dim": 32,
            "text_config": {
                "hidden_act": "quick_gelu",
                "hidden_size": _HIDDEN,
                "intermediate_size": _INTER,
                "max_position_embeddings": 48,
                "num_attention_heads": _HEADS,
                "num_hidden_layers": _LAYERS,
            },
            "vision_config": {
                "hidden_act": "quick_gelu",
                "hidden_size": _HIDDEN,
                "image_size": 32,
                "intermediate_size": _INTER,
                "num_attention_heads": _HEADS,
                "num_hidden_layers": _LAYERS,
                "patch_size": 8,
            },
        },
    },
    "dinov2": {
        "task": "image-feature-extraction",
        "source": "facebook/dinov2-small",
        "auto_class": "Dinov2Model",
        "preprocessor": {
            "class": "BitImageProcessor",
            "do_resize": True,
            "size": {"shortest_edge": 56},
            "do_center_crop": True,
            "crop_size": {"height": 56, "width": 56},
            **_IMAGENET_NORMALIZE,
            "resample": 3,
        },
        "config": {
            "architectures": ["Dinov2Model"],
            "model_type": "dinov2",
            "attention_probs_dropout_prob": 0.0,
            "drop_path_rate": 0.0,
            "hidden_act": "gelu",
            "hidden_dropout_prob": 0.0,
            "hidden_size": _HIDDEN,
            "image_size": 56,
            "initializer_range": 0.02,
            "layer_norm_eps": 1e-06,
            "layerscale_value": 1.0,
            "mlp_ratio": 2,
            "num_attention_heads": _HEADS,
            "num_channels": 3,
            "num_hidden_layers": _LAYERS,
            "patch_size": 14,
            "qkv_bias": True,
            "use_swiglu_ffn": False,
        },
    },
    "depth-anything": {
        "task": "depth-estimation",
        "source": "depth-anything/Depth-Anything-V2-Small-hf",
        "auto_class": "DepthAnythingForDepthEstimation",
        "preprocessor": {
            "class": "DPTImageProcessor",
            "do_resize": True,
            "size": {"height": 56, "width": 56},
            "keep_aspect_ratio": True,
            "ensure_multiple_of": 14,
            "do_pad": False,
            **_IMAGENET_NORMALIZE,
            "resample": 3,
        },
        "config": {
            "architectures": ["DepthAnythingForDepthEstimation"],
            "model_type": "depth_anything",
            "backbone_config": {
                "model_type": "dinov2",
                "hidden_size": 32,
                "image_size": 56,
                "mlp_ratio": 2,
                "num_attention_heads": _HEADS,
                "num_hidden_layers": 4,
                "out_indices": [1, 2, 3, 4],
                "patch_size": 14,
                "reshape_hidden_states": False,
            },
            "depth_estimation_type": "relative",
            "fusion_hidden_size": 16,
            "head_hidden_size": 8,
            "head_in_index": -1,
            "neck_hidden_sizes": [8, 16, 32, 32],
            "patch_size": 14,
            "reassemble_factors": [4, 2, 1, 0.5],
            "reassemble_hidden_size": 32,
        },
    },
    "yolos": {
        "task": "object-detection",
        "source": "hustvl/yolos-tiny",
        "auto_class": "YolosForObjectDetection",
        "init_normal": ["vit.embeddings.detection_tokens", "vit.embeddings.position_embeddings"],
        "preprocessor": {
            "class": "YolosImageProcessor",
            "do_resize": True,
            "size": {"height": 64, "width": 64},
            "do_pad": False,
            **_IMAGENET_NORMALIZE,
        },
        "config": {
            "architectures": ["YolosForObjectDetection"],
            "model_type": "yolos",
            "attention_probs_dropout_prob": 0.0,
            "hidden_act": "gelu",
            "hidden_dropout_prob": 0.0,
            "hidden_size": _HIDDEN,
            "id2label": {"0": "N/A", "1": "person", "2": "bicycle", "3": "car"},
            "image_size": [64, 64],
            "initializer_range": 0.02,
            "intermediate_size": _INTER,
            "layer_norm_eps": 1e-12,
            "num_attention_heads": _HEADS,
            "num_channels": 3,
            "num_detection_tokens": 8,
            "num_hidden_layers": _LAYERS,
            "patch_size": 16,
            "qkv_bias": True,
            "use_mid_position_embeddings": False,
        },
    },
    "segformer": {
        "task": "image-segmentation",
        "source": "nvidia/segformer-b0-finetuned-ade-512-512",
        "auto_class": "SegformerForSemanticSegmentation",
        "labels": [1, 2],  # every pixel of the test card, every pixel of its mirror image
        "preprocessor": {
            "class": "SegformerImageProcessor",
            "do_resize": True,
            "size": {"height": 64, "width": 64},
            **_IMAGENET_NORMALIZE,
            "resample": 2,
        },
        "config": {
            "architectures": ["SegformerForSemanticSegmentation"],
            "model_type": "segformer",
            "attention_probs_dropout_prob": 0.0,
            "classifier_dropout_prob": 0.1,
            "decoder_hidden_size": 32,
            "depths": [1, 1],
            "drop_path_rate": 0.0,
            "hidden_act": "gelu",
            "hidden_dropout_prob": 0.0,
            "hidden_sizes": [16, 32],
            "id2label": {"0": "wall", "1": "building", "2": "sky", "3": "floor"},
            "mlp_ratios": [2, 2],
            "num_attention_heads": [1, 2],
            "num_channels": 3,
            "num_encoder_blocks": 2,
            "patch_sizes": [7, 3],
            "reshape_last_stage": True,
            "sr_ratios": [2, 1],
            "strides": [4, 2],
        },
    },
}
_FORWARD_TRAIN: dict[str, Any] = {"seed": 4711, "steps": 200, "learning_rate": 3e-3, "mask_token": "<mask>"}
#: The forward tasks' repos, by builder name.
FORWARD_REPOS: Mapping[str, str] = MappingProxyType({name: f"{ZOO_ORG}/{name}" for name in _FORWARD_SPECS})


def _forward_inputs() -> dict[str, Any]:
    """What run.py feeds a forward task (the forward models are trained on exactly that)."""
    from pytest_neuron_support.tasks import forward
    from pytest_neuron_support.tasks.table import TASKS

    # Each forward task's reading (its candidate labels, hypotheses, items) and the sentences it reads.
    readings = {
        name: {"options": task.task_options(), "sentences": list(task.reading.sentences)}
        for name, task in TASKS.items()
        if isinstance(task, forward.ForwardTask)
    }
    return {
        "length": forward.LENGTH,
        "sentences": forward.SENTENCES,
        "masked": forward.MASKED_SENTENCES,
        "readings": readings,
    }


def zoo_fingerprint() -> str:
    """Short hash of everything that defines the zoo: architectures, tokenizer and corpus, training
    recipe, seeds, prompt, :data:`ZOO_VERSION` and the versions of the libraries that write it.  Stable
    across processes; changes when any of those change."""
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
        "pipeline": _PIPELINE_SPEC,
        "whisper": _WHISPER_SPEC,
        "seq2seq": _SEQ2SEQ_SPEC,
        "forward": _FORWARD_SPECS,
        "forward_train": _FORWARD_TRAIN,
        "forward_inputs": _forward_inputs(),
        "judge_also_categories": {k: list(v) for k, v in _ALSO_CATEGORY.items()},
        "judge_question": _judge_question(),
        # What writes the checkpoints: a config.json records the transformers version that saved it, so
        # another release builds another zoo (another commit), and a venv of another release (.ci/upstream
        # beside the pinned one) must not be handed this one.
        "writers": {name: _installed(name) for name in ("transformers", "tokenizers", "safetensors", "diffusers")},
    }
    blob = json.dumps(spec, sort_keys=True, separators=(",", ":"), default=repr).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
