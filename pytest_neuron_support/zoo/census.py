"""The census: a tiny random causal LM for every architecture transformers maps as one.

Where the tiny zoo (:mod:`.spec`, :mod:`.build`) hand-picks a dozen architectures from real Hub configs
and trains them to be decisive, the census takes *every* ``model_type`` of the installed transformers'
``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``, starts from that architecture's *default* config class, shrinks
it with one table of field names (no per-architecture code), random-initialises it and installs it in
the Hub cache as ``census/<model_type>``, next to the zoo's tokenizer.  Architectures that do not
survive (a config that refuses the shrunk sizes, a model that needs a remote backbone, a forward pass
that breaks, weights that do not round-trip) are reported with the step and the error instead.

The weights are random: a census model answers "does this architecture load and run", not "does it
generate anything sensible".  Everything is offline and deterministic (one seed per architecture);
torch and transformers are imported lazily, so importing this module stays cheap.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib
import itertools
import json
import re
import shutil
import tempfile
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_neuron_support.base.storage import write_atomic
from pytest_neuron_support.zoo.hubcache import _repo_dir, _snapshot_path, install_snapshot, installed
from pytest_neuron_support.zoo.spec import (
    _BOS,
    _CHAT_TEMPLATE,
    _EOS,
    _EXTRA_LINES,
    _HEAD_DIM,
    _HEADS,
    _HIDDEN,
    _IM_END,
    _INTER,
    _KV_HEADS,
    _LAYERS,
    _MAX_POS,
    _PAD,
    _SPECIAL_TOKENS,
    _TOKENIZER_SPEC,
    _WORDS,
    _HFTokenizer,
)
from pytest_neuron_support.zoo.text import (
    _build_tokenizer,
    _quiet_transformers,
    _single_thread,
    _token_ids,
    _transformers,
)

CENSUS_ORG = "census"

#: Bump when the shrinking rules or the build procedure change: installed census models carrying an
#: older fingerprint are rebuilt.
CENSUS_VERSION = 1

#: A census model must stay tiny: ~200 of them are built, saved and loaded on a laptop.
_MAX_PARAMETERS = 5_000_000

#: An error is reported as "ExcType: first line", cut to this many characters.
_ERROR_CHARS = 300

# ----------------------------------------------------------------------------------------------------
# Shrinking rules: field name -> tiny value, for every spelling the config classes use.  A rule only
# replaces an int (or a per-layer list of ints); None, booleans and strings ("auto") are left alone, so
# an optional feature stays off (q_lora_rank None, sliding_window None) and a switch keeps its default.
# ----------------------------------------------------------------------------------------------------

_EXPERT_INTER = 32
_WINDOW = 32
_IMAGE_SIZE = 32
_PATCH = 8


def _rule(value: int, *names: str) -> dict[str, int]:
    return dict.fromkeys(names, value)


_SIZE_RULES: Mapping[str, int] = {
    # model width (gpt2's n_embd, bart's d_model, xlm's emb_dim, xlstm's embedding_dim, ...)
    **_rule(
        _HIDDEN,
        "hidden_size",
        "d_model",
        "n_embd",
        "emb_dim",
        "embedding_dim",
        "embedding_size",
        "word_embed_proj_dim",
        "input_embedding_size",
        "output_embedding_size",
        "hidden_size_global",
        "lru_width",
        "out_hidden_size",
        "mamba_d_ssm",
        "adapter_in_dim",
        "adapter_out_dim",
        "adapter_input_size",
        # convolutional widths of the vision and audio front ends (got_ocr2's neck, phi4's conformer)
        "output_channels",
        "nemo_conv_channels",
        "ext_pw_out_channel",
        "depthwise_separable_out_channel",
    ),
    # dense MLP width
    **_rule(
        _INTER,
        "intermediate_size",
        "ffn_dim",
        "n_inner",
        "decoder_ffn_dim",
        "encoder_ffn_dim",
        "ffn_hidden_size",
        "d_inner",
        "dim_ff",
        "dff",
        "feed_forward_size",
        "intermediate_size_mlp",
        "dense_intermediate_size",
        "prefix_dense_intermediate_size",
        "mlp_dim",
    ),
    # one expert's (and a shared expert's) MLP width
    **_rule(
        _EXPERT_INTER,
        "moe_intermediate_size",
        "expert_ffn_hidden_size",
        "shared_expert_intermediate_size",
        "moe_shared_expert_intermediate_size",
        "shared_intermediate_size",
        "shared_experts_intermediate_size",
    ),
    # depth (the decoder's, and an encoder's that a causal-LM class may still build)
    **_rule(
        _LAYERS,
        "num_hidden_layers",
        "n_layer",
        "n_layers",
        "num_layers",
        "encoder_layers",
        "decoder_layers",
        "num_encoder_layers",
        "num_decoder_layers",
        "depth",
        "num_blocks",
        "num_layers_per_stack",
    ),
    # attention heads
    **_rule(
        _HEADS,
        "num_attention_heads",
        "n_head",
        "n_heads",
        "num_heads",
        "encoder_attention_heads",
        "decoder_attention_heads",
        "attention_heads",
        "num_encoder_attention_heads",
        "num_decoder_attention_heads",
        "swa_num_attention_heads",
        "linear_num_value_heads",
        "linear_num_heads",
        "index_n_heads",
        "indexer_n_heads",
        "mamba_n_heads",
        "mamba_num_heads",
        "n_mamba_heads",
    ),
    **_rule(
        _KV_HEADS,
        "num_key_value_heads",
        "num_kv_heads",
        "kv_n_heads",
        "swa_num_key_value_heads",
        "linear_num_key_heads",
        "indexer_kv_heads",
        "num_query_groups",
    ),
    **_rule(
        _HEAD_DIM,
        "head_dim",
        "kv_channels",
        "attention_head_dim",
        "d_head",
        "dim_head",
        "swa_head_dim",
        "attention_head_size",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_head_dim",
        "index_head_dim",
        "indexer_head_dim",
        "mamba_d_head",
        "mamba_head_dim",
        "mamba_headdim",
        "v_head_dim",
        "qk_head_dim",
        "kv_lora_rank",
        "mamba_d_state",
        "state_size",
        "ssm_state_size",
    ),
    # multi-head latent attention: the rotary and plain halves of a query/key head (16 together)
    **_rule(_HEAD_DIM // 2, "qk_rope_head_dim", "qk_nope_head_dim"),
    **_rule(2 * _HEAD_DIM, "q_lora_rank", "o_lora_rank"),
    # positions (the zoo tokenizer's model_max_length)
    **_rule(
        _MAX_POS,
        "max_position_embeddings",
        "n_positions",
        "max_seq_len",
        "context_length",
        "n_ctx",
        "model_max_length",
        "max_target_positions",
        "max_source_positions",
    ),
    # mixture of experts: 4 experts, 2 per token, 1 shared, one routing group
    **_rule(4, "num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"),
    "zero_expert_num": 2,  # longcat_flash's identity experts, routed like the others
    **_rule(2, "num_experts_per_tok", "moe_k", "moe_topk", "num_experts_per_token", "top_k_experts", "moe_top_k"),
    **_rule(1, "n_shared_experts", "num_shared_experts", "moe_num_shared_experts"),
    **_rule(1, "n_group", "num_expert_group", "topk_group"),
    # state-space layers: one group, inner width = heads x head dim = hidden (expand 1)
    **_rule(1, "n_groups", "mamba_n_groups", "mamba_ngroups", "expand", "mamba_expand"),
    # local attention windows: smaller than the prompt of the longer tests
    **_rule(
        _WINDOW,
        "sliding_window",
        "sliding_window_size",
        "attention_window_size",
        "attention_chunk_size",
        "local_attention_window_len",
    ),
    # vision towers of the multimodal configs: 16 patches of 8x8 pixels
    "image_size": _IMAGE_SIZE,
    "patch_size": _PATCH,
    # side embeddings (roc_bert's glyph and pinyin, blt's hashed byte n-grams, per-layer inputs)
    **_rule(_HEAD_DIM, "shape_embed_dim", "pronunciation_embed_dim", "ple_embed_dim", "hidden_size_per_layer_input"),
    **_rule(64, "shape_vocab_size", "pronunciation_vocab_size", "encoder_hash_byte_group_vocab"),
    # sparse attention's token budget: fewer than the forward pass's prompt, so selection happens
    "index_topk": 8,
    # no KV sharing across layers: with one layer of each kind left, no layer has a producer to share
    "num_kv_shared_layers": 0,
    # partial rotary embeddings (gptj, codegen): half of each head
    "rotary_dim": _HEAD_DIM // 2,
    # reformer's factored position embeddings: 16 x 16 positions (= 256), 32 + 32 wide (= 64)
    "axial_pos_shape": 16,
    "axial_pos_embds_dim": _HIDDEN // 2,
}

#: Counts a rule lowers but never raises: a default of one KV head (multi-query attention), one expert
#: per token (zaya supports no other) or no shared expert is part of what the architecture is.
_NEVER_RAISED = frozenset(
    {"num_key_value_heads", "num_kv_heads", "kv_n_heads", "swa_num_key_value_heads", "num_query_groups"}
    | {"num_experts_per_tok", "moe_k", "moe_topk", "num_experts_per_token", "top_k_experts", "moe_top_k"}
    | {"n_shared_experts", "num_shared_experts", "moe_num_shared_experts"}
)

#: Fields that stay equal to another where the default has them equal (follower: leader): as many KV
#: heads as query heads is plain multi-head attention (dots3 insists on it); an MLA config whose
#: head_dim is its rotary head dim (deepseek_v3, longcat_flash) rotates head_dim channels.
_KEPT_EQUAL: Mapping[str, str] = {
    "num_key_value_heads": "num_attention_heads",
    "num_kv_heads": "num_attention_heads",
    "swa_num_key_value_heads": "swa_num_attention_heads",
    "linear_num_key_heads": "linear_num_value_heads",
    "head_dim": "qk_rope_head_dim",
}

#: Rules applied even where the default is None: None there means "derive it" (head_dim from the
#: width, the KV heads from the heads, gpt2's n_inner as 4 x width) or is a default that no model
#: can run with (dots1's expert counts), never "feature off".
_EVEN_IF_NONE = frozenset(
    {"head_dim", "num_key_value_heads", "n_inner", "intermediate_size"}
    | {"num_experts_per_tok", "n_routed_experts", "n_shared_experts"}
)

#: Widths derived from the model width by a factor (zamba's attention runs on 2 x hidden_size, rwkv's
#: on 1 x): scaled with it.
_SCALED_WITH_WIDTH = ("attention_hidden_size",)

#: Vocabularies that must be the tokenizer's (inkling2's unpadded, marian's decoder, gemma3n's
#: per-layer inputs), besides vocab_size itself.
_VOCAB_FIELDS = ("vocab_size", "unpadded_vocab_size", "decoder_vocab_size", "vocab_size_per_layer_input")

#: Fields that must name one of a list's entries (xmod's adapters run for a default language only),
#: as field: list field; a None default becomes the list's first entry.
_CHOSEN_FROM: Mapping[str, str] = {"default_language": "languages"}

#: Flags a causal LM needs on: encoder families (bert, roberta, reformer, ...) mapped as causal LMs
#: are only causal with is_decoder set.
_FLAGS: Mapping[str, bool] = {"is_decoder": True}

#: At most this many layers of the default stack are kept, whatever the number of layer kinds.
_MAX_DEPTH = 8

#: Fields counting layers *within* the (shrunk) stack: at most the new depth minus one, so a dense
#: prefix (deepseek's first_k_dense_replace) still leaves a MoE layer after it.
_LAYER_COUNT_FIELDS = ("first_k_dense_replace", "num_dense_layers")

#: Fields naming the depth itself; the first one a config has is its stack's length.
_DEPTH_FIELDS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "decoder_layers", "depth")

# Lists of layer indices (mllama's cross_attention_layers, llama4's moe_layers, ...): a list of ints,
# under a name that says so.
_INDEX_LIST = re.compile(r"(layer|idx|ids|indices|indexes)", re.IGNORECASE)


def _census_seed(model_type: str) -> int:
    """A seed stable across processes and Python versions (``hash()`` is salted per process)."""
    return zlib.crc32(f"census/{model_type}".encode())


def census_architectures() -> tuple[str, ...]:
    """Every model_type of the installed transformers' causal-LM auto mapping, sorted."""
    return tuple(sorted(_model_classes()))


def _model_classes() -> Mapping[str, str]:
    """model_type -> causal-LM class name, from transformers' auto mapping (names only: no import)."""
    mapping: Mapping[str, str] = importlib.import_module(
        "transformers.models.auto.modeling_auto"
    ).MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    return mapping


def _census_fingerprint() -> str:
    """Short hash of what a census model depends on: this module's rules and :data:`CENSUS_VERSION`,
    the transformers and torch versions that define and save the architectures, and the zoo
    tokenizer's definition (its vocabulary size is every model's vocab_size)."""
    import torch

    transformers = _transformers()
    spec = {
        "census": CENSUS_VERSION,
        "rules": dict(_SIZE_RULES),
        "never_raised": sorted(_NEVER_RAISED),
        "kept_equal": dict(_KEPT_EQUAL),
        "even_if_none": sorted(_EVEN_IF_NONE),
        "scaled": list(_SCALED_WITH_WIDTH),
        "vocab_fields": list(_VOCAB_FIELDS),
        "chosen_from": dict(_CHOSEN_FROM),
        "flags": dict(_FLAGS),
        "depth": [_MAX_DEPTH, list(_LAYER_COUNT_FIELDS), list(_DEPTH_FIELDS), _INDEX_LIST.pattern],
        "max_parameters": _MAX_PARAMETERS,
        "transformers": transformers.__version__,
        "torch": torch.__version__.split("+")[0],
        "tokenizer": _TOKENIZER_SPEC,
        "words": {k: list(v) for k, v in _WORDS.items()},
        "extra_lines": list(_EXTRA_LINES),
        "special_tokens": list(_SPECIAL_TOKENS),
        "chat_template": _CHAT_TEMPLATE,
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------------------------------
# Shrinking a config
# ----------------------------------------------------------------------------------------------------


def _aliases(config_class: type) -> dict[str, str]:
    """Rule names a config spells differently (gpt2: hidden_size -> n_embd), as rule -> real field;
    a real field that has a rule of its own keeps it (deepseek_v4 maps intermediate_size onto
    moe_intermediate_size, which must stay the expert width)."""
    attribute_map: Mapping[str, str] = getattr(config_class, "attribute_map", {}) or {}
    return {alias: real for alias, real in attribute_map.items() if alias in _SIZE_RULES and real not in _SIZE_RULES}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_index_list(key: str, value: Any, depth: int) -> bool:
    """A list of layer indices (mllama's cross_attention_layers, llama4's moe_layers): increasing ints
    below the depth, under a name that says so."""
    return (
        bool(_INDEX_LIST.search(key))
        and isinstance(value, list)
        and bool(value)
        and all(_is_int(i) and 0 <= i < depth for i in value)
        and all(a < b for a, b in itertools.pairwise(value))
    )


def _is_per_layer(key: str, value: Any, depth: int) -> bool:
    """One entry per layer (layer_types, mlp_layer_types, llama4's no_rope_layers flags)."""
    return isinstance(value, list) and len(value) == depth and not _is_index_list(key, value, depth)


def _is_layer_map(value: Any, depth: int) -> bool:
    """A dict keyed by layer numbers (gemma4's per_layer_config: ``{"05": {"head_dim": 512}}``)."""
    return (
        isinstance(value, dict)
        and bool(value)
        and all(isinstance(k, str) and k.isdigit() and int(k) < depth for k in value)
    )


def _layer_key(layer_map: Mapping[str, Any], layer: int) -> str:
    return str(layer).zfill(max(len(k) for k in layer_map))


def _layer_selection(d: Mapping[str, Any], depth: int, per_kind: int) -> list[int]:
    """Which of the ``depth`` default layers to keep: the first ``per_kind`` layers of every distinct
    kind (a kind being the layer's entries in the per-layer lists and its membership in the index
    lists and layer maps), so a hybrid stack keeps each of its layer kinds (qwen3_next: linear and full
    attention; gemma3: sliding and global; mllama: self- and cross-attention).  At least
    :data:`_LAYERS` and at most :data:`_MAX_DEPTH` layers, in their original order."""
    per_layer = [v for k, v in d.items() if _is_per_layer(k, v, depth)]
    index_sets = [set(v) for k, v in d.items() if _is_index_list(k, v, depth)]
    layer_maps = [v for v in d.values() if _is_layer_map(v, depth)]
    kinds: dict[str, int] = {}
    keep: list[int] = []
    for i in range(depth):
        kind = json.dumps(
            [[lst[i] for lst in per_layer], [i in s for s in index_sets], [_layer_key(m, i) in m for m in layer_maps]],
            default=str,
        )
        if kinds.get(kind, 0) < per_kind:
            kinds[kind] = kinds.get(kind, 0) + 1
            keep.append(i)
    keep = keep[:_MAX_DEPTH]
    keep += [i for i in range(depth) if i not in keep][: max(0, _LAYERS - len(keep))]
    return sorted(keep)


def _select_layers(d: dict[str, Any], depth: int, keep: Sequence[int]) -> None:
    """Cut every per-layer field of ``d`` down to the ``keep`` layers, renumbered from 0."""
    new_index = {old: new for new, old in enumerate(keep)}
    for key, value in list(d.items()):
        if _is_index_list(key, value, depth):
            d[key] = [new_index[i] for i in value if i in new_index]
        elif _is_per_layer(key, value, depth):
            d[key] = [value[i] for i in keep]
        elif _is_layer_map(value, depth):
            d[key] = {_layer_key(value, new_index[int(k)]): v for k, v in value.items() if int(k) in new_index}


def _apply_rules(
    d: dict[str, Any], rules: Mapping[str, int], aliases: Mapping[str, str], old_width: int | None
) -> None:
    """Replace every int field of ``d`` that has a rule, and every int of a per-layer list of them (one
    size per layer), and shrink the entries of a per-layer override map the same way.  None stays
    None (a feature off) unless the field is in :data:`_EVEN_IF_NONE`; :data:`_NEVER_RAISED` counts
    only go down; :data:`_KEPT_EQUAL` pairs equal in the default stay equal; ``old_width`` (the
    default model width) scales :data:`_SCALED_WITH_WIDTH`."""
    real = {name: aliases.get(name, name) for name in {*_NEVER_RAISED, *_KEPT_EQUAL, *_KEPT_EQUAL.values()}}
    never_raised = {real[name] for name in _NEVER_RAISED}
    equal = {
        f: leader for f, leader in _KEPT_EQUAL.items() if _is_int(d.get(real[f])) and d[real[f]] == d.get(real[leader])
    }
    for key, value in d.items():
        if key in _SCALED_WITH_WIDTH and _is_int(value) and old_width:
            d[key] = max(1, round(value * _HIDDEN / old_width))
        elif _is_layer_map_of_fields(value):
            for entry in value.values():
                _apply_rules(entry, rules, aliases, old_width)
        elif key not in rules:
            continue
        elif _is_int(value):
            d[key] = min(value, rules[key]) if key in never_raised else rules[key]
        elif value is None and key in _EVEN_IF_NONE:
            d[key] = rules[key]
        elif isinstance(value, list) and value and all(_is_int(v) for v in value):
            d[key] = [min(v, rules[key]) if key in never_raised else rules[key] for v in value]
    for follower, leader in equal.items():
        d[real[follower]] = d[real[leader]]


def _is_layer_map_of_fields(value: Any) -> bool:
    """Per-layer overrides keyed by layer number, each a dict of config fields (gemma4, dots3)."""
    return (
        isinstance(value, dict)
        and bool(value)
        and all(isinstance(k, str) and k.isdigit() and isinstance(v, dict) for k, v in value.items())
    )


def _shrink_dict(
    d: dict[str, Any], config_class: type, vocab_size: int, ids: Mapping[str, int], per_kind: int
) -> dict[str, Any]:
    """Shrink one config's own fields in place (its sub-configs are shrunk by the caller, each with
    its own class) and return it."""
    aliases = _aliases(config_class)
    rules: dict[str, int] = {**{real: _SIZE_RULES[alias] for alias, real in aliases.items()}, **_SIZE_RULES}
    depth_field = next(
        (f for f in (aliases.get("num_hidden_layers", "num_hidden_layers"), *_DEPTH_FIELDS) if _is_int(d.get(f))),
        None,
    )
    width = d.get(aliases.get("hidden_size", "hidden_size"))
    new_depth = _LAYERS
    if depth_field is not None and d[depth_field] > _LAYERS:
        depth = d[depth_field]
        keep = _layer_selection(d, depth, per_kind)
        _select_layers(d, depth, keep)
        new_depth = len(keep)
    _apply_rules(d, rules, aliases, width if _is_int(width) else None)
    if depth_field is not None:
        d[depth_field] = new_depth
    for key in _LAYER_COUNT_FIELDS:
        if _is_int(d.get(key)) and d[key] > 0:
            d[key] = min(d[key], new_depth - 1)
    for key, choices in _CHOSEN_FROM.items():
        if key in d and d[key] is None and isinstance(d.get(choices), list) and d[choices]:
            d[key] = d[choices][0]
    for key, flag in _FLAGS.items():
        if isinstance(d.get(key), bool):
            d[key] = flag
    # The zoo tokenizer's vocabulary and special tokens, under whatever name the config keeps them
    # (xlm's n_words is an alias of vocab_size); a None pad becomes the tokenizer's pad.
    attribute_map: Mapping[str, str] = getattr(config_class, "attribute_map", {}) or {}
    tokens = {
        **dict.fromkeys(_VOCAB_FIELDS, vocab_size),
        "bos_token_id": ids[_BOS],
        "eos_token_id": ids[_EOS],
        "pad_token_id": ids[_PAD],
    }
    for name, value in tokens.items():
        key = attribute_map.get(name, name)
        if key in d and not isinstance(d[key], bool) and (d[key] is not None or name.endswith("_token_id")):
            d[key] = value
    return d


def _shrunk_config(model_type: str, vocab_size: int, ids: Mapping[str, int], per_kind: int = 1) -> Any:
    """The default config of ``model_type``, shrunk by the rules, its sub-configs (text, vision,
    audio, ...) likewise, rebuilt through the config class so its own validation runs.  ``per_kind``:
    how many layers of each layer kind to keep."""
    default = _transformers().AutoConfig.for_model(model_type)
    return _shrink_config_object(default, vocab_size, ids, per_kind)


def _shrink_config_object(config: Any, vocab_size: int, ids: Mapping[str, int], per_kind: int) -> Any:
    pretrained_config = _transformers().PretrainedConfig
    d: dict[str, Any] = copy.deepcopy(config.to_dict())
    # vars(), not getattr(): a config with per-layer overrides (gemma4) refuses to read per-layer
    # fields globally.
    for key, sub in vars(config).items():
        if key in d and isinstance(sub, pretrained_config):
            d[key] = _shrink_config_object(sub, vocab_size, ids, per_kind).to_dict()
    d = _shrink_dict(d, type(config), vocab_size, ids, per_kind)
    return type(config).from_dict(d)


# ----------------------------------------------------------------------------------------------------
# Building one architecture
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CensusBuild:
    """The outcome of one architecture of the census.

    Attributes:
        model_type: the transformers ``model_type``.
        repo_id: ``census/<model_type>`` when built (installed in the cache), None when not.
        model_class: the causal-LM mapping's class name for it, e.g. ``LlamaForCausalLM``.
        parameters: the shrunk model's parameter count (None when it never got that far).
        step: where the build failed: ``config``, ``model``, ``forward``, ``save`` or ``load``; None
            when built.
        error: ``"ExcType: first line of the message"`` (at most ~300 characters); None when built.
    """

    model_type: str
    repo_id: str | None
    model_class: str
    parameters: int | None
    step: str | None
    error: str | None


class _StepFailed(Exception):
    """One architecture's build failed at ``step``; carries the parameter count when known."""

    def __init__(self, step: str, error: str, parameters: int | None = None) -> None:
        super().__init__(error)
        self.step = step
        self.error = error
        self.parameters = parameters


def _describe(exc: BaseException) -> str:
    """``"ExcType: first line"``; a first line that only introduces the next (ends with ':', as
    huggingface_hub's strict-dataclass validation errors do) gets the next line too."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    message = lines[0] if lines else ""
    if message.endswith(":") and len(lines) > 1:
        message = f"{message} {lines[1]}"
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return text if len(text) <= _ERROR_CHARS else text[: _ERROR_CHARS - 3] + "..."


@contextlib.contextmanager
def _step(name: str, parameters: int | None = None) -> Iterator[None]:
    try:
        yield
    except _StepFailed:
        raise
    except Exception as exc:
        raise _StepFailed(name, _describe(exc), parameters) from exc


def _prompt_ids(tokenizer: _HFTokenizer) -> Any:
    import torch

    ids = [int(i) for i in tokenizer("the quick brown fox jumps over the lazy dog")["input_ids"]]
    return torch.tensor([[int(tokenizer.convert_tokens_to_ids(_BOS)), *ids]])


def _logits(model: Any, input_ids: Any) -> Any:
    import torch

    with torch.no_grad():
        out = model(input_ids=input_ids, use_cache=False)
    logits = out.logits if hasattr(out, "logits") else out[0]
    return logits.float()


def _count_parameters(config: Any) -> int:
    """The parameter count of ``config``'s causal LM, from an instance on the meta device: nothing is
    allocated, so a config the rules failed to shrink cannot take the machine's memory."""
    import torch

    transformers = _transformers()

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def _model_card(model_type: str, model_class: str, config: Any, parameters: int, fingerprint: str) -> str:
    version = _transformers().__version__
    return (
        "---\n"
        "library_name: transformers\n"
        "pipeline_tag: text-generation\n"
        f"tags: [tiny-random, test, census, {model_type}]\n"
        f"census_fingerprint: {fingerprint}\n"
        f"census_model_class: {model_class}\n"
        f"census_parameters: {parameters}\n"
        "---\n\n"
        f"# {CENSUS_ORG}/{model_type}\n\n"
        "Random weights, built offline by the census (`pytest_neuron_support.zoo.census`) from\n"
        f"transformers {version}'s default `{type(config).__name__}` shrunk: width {_HIDDEN}, MLP {_INTER},\n"
        f"{_HEADS} heads of {_HEAD_DIM}, {_LAYERS} layers or one of each layer kind, 4 experts, the zoo tokenizer's\n"
        f"vocabulary. A `{model_class}` of {parameters:,} parameters.\n\n"
        "Not a language model: it shows that the architecture builds, runs, saves and loads, nothing more.\n"
    )


def _checked_model(model_type: str, tokenizer: _HFTokenizer, input_ids: Any) -> tuple[Any, Any, Any, int]:
    """The shrunk config, its random-initialised model (float32, the architecture's own seed), the
    logits of one forward pass and the parameter count; raises :class:`_StepFailed`.

    Keeping one layer of each kind is tried first; where that fails, two of each (zamba ties the
    weights of its hybrid layers together, which takes at least two of them).  The first failure is
    the one reported."""
    first: _StepFailed | None = None
    previous: dict[str, Any] | None = None
    for per_kind in (1, 2):
        try:
            with _step("config"):
                config = _shrunk_config(model_type, len(tokenizer), _token_ids(tokenizer), per_kind)
                shape = config.to_dict()
            if shape == previous:
                break  # keeping more layers changed nothing: it would fail the same way
            previous = shape
            return (config, *_instantiate(model_type, config, input_ids))
        except _StepFailed as failed:
            first = first or failed
    assert first is not None
    raise first


def _instantiate(model_type: str, config: Any, input_ids: Any) -> tuple[Any, Any, int]:
    import torch

    transformers = _transformers()

    with _step("model"):
        parameters = _count_parameters(config)
    if parameters > _MAX_PARAMETERS:
        raise _StepFailed("model", f"too large after shrinking: {parameters} params", parameters)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_census_seed(model_type))
        with _step("model", parameters):
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
            model.eval()
        with _step("forward", parameters):
            logits = _logits(model, input_ids)
            if not bool(torch.isfinite(logits).all()):
                raise ValueError("the forward pass gave non-finite logits")
    return model, logits, parameters


def _build_one(
    model_type: str,
    model_class: str,
    tokenizer: _HFTokenizer,
    tokenizer_dir: Path,
    cache_dir: Path,
    fingerprint: str,
    work_dir: Path,
) -> int:
    """Build, check, save and install one architecture; returns its parameter count or raises
    :class:`_StepFailed` (and then leaves no ``census/<model_type>`` in the cache)."""
    import torch

    transformers = _transformers()

    ids = _token_ids(tokenizer)
    input_ids = _prompt_ids(tokenizer)
    config, model, logits, parameters = _checked_model(model_type, tokenizer, input_ids)
    out_dir = work_dir / model_type
    with _step("save", parameters):
        model.save_pretrained(str(out_dir))
        for f in tokenizer_dir.iterdir():
            shutil.copyfile(f, out_dir / f.name)
        # The model class's own generation defaults (minus transformers' bookkeeping), made greedy
        # and given the zoo tokenizer's special tokens.
        defaults = model.generation_config.to_diff_dict()
        generation = {
            **{k: v for k, v in defaults.items() if not k.startswith("_")},
            "bos_token_id": ids[_BOS],
            "do_sample": False,
            "eos_token_id": [ids[_EOS], ids[_IM_END]],
            "pad_token_id": ids[_PAD],
        }
        write_atomic(out_dir / "generation_config.json", json.dumps(generation, indent=2, sort_keys=True) + "\n")
        write_atomic(out_dir / "README.md", _model_card(model_type, model_class, config, parameters, fingerprint))
        repo_id = f"{CENSUS_ORG}/{model_type}"
        snapshot = install_snapshot(cache_dir, repo_id, out_dir)
    del model
    try:
        with _step("load", parameters):
            reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(snapshot), dtype=torch.float32)
            reloaded.eval()
            again = _logits(reloaded, input_ids)
            if again.shape != logits.shape or not torch.allclose(again, logits, atol=1e-4, rtol=1e-4):
                diff = (again - logits).abs().max().item() if again.shape == logits.shape else "shape"
                raise ValueError(f"the reloaded model's logits differ from the built one's (max |diff| {diff})")
            transformers.AutoTokenizer.from_pretrained(str(snapshot))
    except _StepFailed:
        # Not left installed: a later call would take it for a good census model and reuse it.
        shutil.rmtree(_repo_dir(cache_dir, repo_id), ignore_errors=True)
        raise
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    return parameters


def _installed_card(cache_dir: Path, repo_id: str) -> dict[str, str]:
    """The ``census_*`` fields of an installed census model's card (empty when none is installed)."""
    snapshot = _snapshot_path(cache_dir, repo_id)
    if snapshot is None or not installed(cache_dir, repo_id):
        return {}
    try:
        card = (snapshot / "README.md").read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in card.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.startswith("census_"):
            fields[key] = value.strip()
    return fields


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """No Hub access during the build whatever the environment says: a model class reaching for a
    remote backbone or tokenizer fails (and is reported) instead of downloading.  huggingface_hub
    reads HF_HUB_OFFLINE once, into this constant, which its clients consult on every request."""
    constants: Any = importlib.import_module("huggingface_hub.constants")
    previous = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = previous


def build_census(
    cache_dir: Path,
    model_types: Sequence[str] | None = None,
    *,
    progress: Callable[[CensusBuild], None] | None = None,
) -> list[CensusBuild]:
    """Build (or reuse, when already installed with the same fingerprint) each architecture's tiny model
    into cache_dir; one CensusBuild per model_type in order; never raises for one architecture's failure.

    ``model_types`` defaults to :func:`census_architectures`; an unknown one is reported as failing at
    the ``config`` step.  ``progress`` is called with each result as it is known.  Builds run one at a
    time on one thread, offline, under a lock in ``<cache_dir>/.locks``; the zoo tokenizer is trained
    once per call, and only if something is left to build.  Failures are not cached (they are cheap to
    find again); an architecture that fails leaves no ``census/<model_type>`` in the cache, not even
    one an earlier fingerprint built.
    """
    from filelock import FileLock

    cache_dir = Path(cache_dir)
    wanted = list(census_architectures() if model_types is None else model_types)
    classes = _model_classes()
    fingerprint = _census_fingerprint()
    results: list[CensusBuild] = []
    (cache_dir / ".locks").mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        # Another process building the census into the same cache waits: no two builders install,
        # or remove, the same repo at once.
        stack.enter_context(FileLock(str(cache_dir / ".locks" / "census.lock")))
        tools: tuple[_HFTokenizer, Path, Path] | None = None
        for model_type in wanted:
            repo_id = f"{CENSUS_ORG}/{model_type}"
            model_class = classes.get(model_type, "")
            card = _installed_card(cache_dir, repo_id)
            if card.get("census_fingerprint") == fingerprint and card.get("census_parameters", "").isdigit():
                result = CensusBuild(model_type, repo_id, model_class, int(card["census_parameters"]), None, None)
            elif not model_class:
                error = f"KeyError: {model_type!r} is not a model_type of the causal-LM mapping"
                result = CensusBuild(model_type, None, "", None, "config", error)
            else:
                if tools is None:
                    tools = _enter_build(stack)
                tokenizer, tokenizer_dir, work_dir = tools
                try:
                    parameters = _build_one(
                        model_type, model_class, tokenizer, tokenizer_dir, cache_dir, fingerprint, work_dir
                    )
                    result = CensusBuild(model_type, repo_id, model_class, parameters, None, None)
                except Exception as exc:  # one architecture's failure, whatever it is, must not stop the census
                    failed = exc if isinstance(exc, _StepFailed) else _StepFailed("model", _describe(exc))
                    result = CensusBuild(model_type, None, model_class, failed.parameters, failed.step, failed.error)
                    # A census model from an older fingerprint that no longer builds is not left behind.
                    shutil.rmtree(_repo_dir(cache_dir, repo_id), ignore_errors=True)
            results.append(result)
            if progress is not None:
                progress(result)
    return results


def _enter_build(stack: contextlib.ExitStack[Any]) -> tuple[_HFTokenizer, Path, Path]:
    """Set up for building (offline, quiet, one thread, a temporary directory, until ``stack`` closes)
    and train the zoo tokenizer; returns it, the directory of its files and a work directory."""
    stack.enter_context(_offline())
    stack.enter_context(_quiet_transformers())
    stack.enter_context(_single_thread())
    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="census-")))
    tokenizer = _build_tokenizer(tmp / "tokenizer")
    work_dir = tmp / "models"
    work_dir.mkdir()
    return tokenizer, tmp / "tokenizer", work_dir
