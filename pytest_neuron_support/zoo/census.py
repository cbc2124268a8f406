"""The census: a tiny random model for every architecture transformers maps to a task the census has.

Where the tiny zoo (:mod:`.spec`, :mod:`.build`) hand-picks a few architectures from real Hub configs
and trains them to be decisive, the census takes *every* ``model_type`` of the installed transformers'
registry of each task it has (:func:`census_tasks`: ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` for text
generation, the seq2seq registry for encoder-decoder generation, each forward task row's own registry),
starts from that architecture's *default* config class, shrinks it with one table of field names (no
per-architecture code), random-initialises it and installs it in the Hub cache as ``census/<model_type>``
(text generation, next to the zoo's tokenizer) or ``census-<task>/<model_type>`` (with the architecture's own
preprocessor).  Architectures that do not survive (no preprocessor transformers maps to it, a config that
refuses the shrunk sizes, a model that needs a library that is not installed, a forward pass that breaks,
weights that do not round-trip) are reported with the step and the error instead.

The weights are random: a census model answers "does this architecture load and run", not "does it
generate anything sensible".  Everything is offline and deterministic (one seed per architecture);
torch and transformers are imported lazily, so importing this module stays cheap.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
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
    _FORWARD_TRAIN,
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
#: An image processor's sizes the census sets to :data:`_MEDIA_IMAGE_SIZE` wherever its defaults have them (224 x 224,
#: a 384 shortest edge, DETR's 800 / 1333): run.py's test card reaches the tiny model at the size its config has.
_IMAGE_SIZE_FIELDS = ("height", "width", "shortest_edge", "longest_edge")
#: The image size of the tasks other than text generation: 64 pixels, not the multimodal towers' 32, so a
#: convolutional backbone's four stride-2 stages after its stride-4 stem still have pixels left (at 32 ConvNeXt's
#: last downsampling kernel is larger than its input).
_MEDIA_IMAGE_SIZE = 64
#: Which of an architecture's image processors the census takes: the PIL one (torchvision is not a dependency).
_IMAGE_BACKEND = "pil"


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

#: Rules the tasks other than text generation add (text generation's census predates them and keeps its models):
#: hierarchical vision backbones (ConvNeXt, Swin, SegFormer, ResNet) get every stage's width small and one block a
#: stage, a dense-prediction neck (DPT's) small widths.
_VISION_RULES: Mapping[str, int] = {
    **_rule(2 * _HEAD_DIM, "hidden_sizes", "neck_hidden_sizes", "embed_dim", "fusion_hidden_size"),
    "depths": 1,
    "image_size": _MEDIA_IMAGE_SIZE,
}

#: Fields a backbone config derives from its depth (``stage_names``, and which stages it outputs): left out of a
#: shrunk config, so the config class derives them again for the stages left.
_DERIVED_FROM_DEPTH = ("stage_names", "out_features", "out_indices")

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


def _census_seed(repo_id: str) -> int:
    """A seed stable across processes and Python versions (``hash()`` is salted per process)."""
    return zlib.crc32(repo_id.encode())


#: The task whose census came first: its models keep the names ``census/<model_type>``.
TEXT_GENERATION = "text-generation"

#: Encoder-decoder text generation (T5, BART, Marian): the prompt on the encoder side, greedy decoding.
TEXT2TEXT = "text2text-generation"

#: The preprocessor a task's model is fed through, by the input kind of its task row: run.py's own loader class.
_TOKENIZER = "AutoTokenizer"


@dataclass(frozen=True)
class Shrinking:
    """How a task's configs are shrunk beyond :data:`_SIZE_RULES`: switches set where a config has them, rules
    added, fields dropped (for the config class to derive again) when the depth is cut, and whether a default
    timm backbone is swapped for transformers' own (``own_backbone``: DETR's default backbone is timm's ResNet-50,
    and timm is not a dependency; its config builds transformers' ResNet instead when asked), and whether the
    decoder starts at the zoo tokenizer's pad (``decoder_start``: an encoder-decoder's, as T5's starts at its pad).
    """

    flags: Mapping[str, bool] = dataclasses.field(default_factory=dict)
    rules: Mapping[str, int] = dataclasses.field(default_factory=dict)
    derived: tuple[str, ...] = ()
    own_backbone: bool = False
    decoder_start: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "flags": dict(self.flags),
            "rules": dict(self.rules),
            "derived": list(self.derived),
            "own_backbone": self.own_backbone,
            "decoder_start": self.decoder_start,
        }


#: Text generation's shrinking: causal with ``is_decoder``, nothing else.
_CAUSAL = Shrinking(_FLAGS)
#: Encoder-decoder generation's: the decoder starts at the zoo tokenizer's pad, nothing else.
_SEQ2SEQ = Shrinking(decoder_start=True)
#: Every other task's: the vision rules, backbone stages derived again, transformers' own backbones.
_FORWARD = Shrinking({}, _VISION_RULES, _DERIVED_FROM_DEPTH, own_backbone=True)


@dataclass(frozen=True)
class CensusTask:
    """What the census builds for one task: the task row's Auto class and registry, and how its inputs are made.

    Attributes:
        name: the task row's name (tasks/table.py).
        auto_class: the transformers Auto class the row loads its model with.
        registry: transformers' mapping of the architectures it maps for the task (``MODEL_FOR_..._NAMES``).
        pipeline_tag: the Hub's pipeline tag, for the model card.
        inputs: ``prompt`` (the zoo tokenizer's prompt ids: a causal LM's forward), ``seq2seq`` (the prompt on the
            encoder side, the decoder's start token on the other: an encoder-decoder's forward), or the forward
            row's kind of input (``text``, ``image``, ``audio``), fed as run.py feeds it (its own ``forward_batch``).
        preprocessor: the Auto class run.py loads the preprocessor with (``AutoTokenizer`` for text).
        output: the output the forward pass is checked on (finite, and the same after the reload).
        shrinking: how its configs are shrunk beyond the common rules (:class:`Shrinking`): a causal LM's
            ``is_decoder`` (encoder families mapped as causal LMs are only causal with it); the other tasks'
            offline backbones and vision rules.
    """

    name: str
    auto_class: str
    registry: str
    pipeline_tag: str
    inputs: str
    preprocessor: str
    output: str
    shrinking: Shrinking

    @property
    def generates(self) -> bool:
        """Its run.py generates (a causal LM, an encoder-decoder): its model ships greedy generation defaults."""
        return self.inputs in ("prompt", "seq2seq")

    def repo_id(self, model_type: str) -> str:
        """Where its model of ``model_type`` is installed: ``census/<model_type>`` for text generation (as
        before the census had tasks), ``census-<task>/<model_type>`` for the others."""
        org = CENSUS_ORG if self.name == TEXT_GENERATION else f"{CENSUS_ORG}-{self.name}"
        return f"{org}/{model_type}"


def census_tasks() -> Mapping[str, CensusTask]:
    """Every task the census builds, by name: text generation, encoder-decoder text generation, and each forward
    task row (tasks/table.py) with a registry of its own, in the table's order. Other rows are left out
    (docs/census.md says why): their generation paths need each architecture's own processor (image-text-to-text,
    Whisper-style speech recognition), diffusers pipelines (text-to-image) or share another row's registry
    (zero-shot classification)."""
    # Imported here: the task table imports the run machinery, which the rest of this module does not need.
    from pytest_neuron_support.tasks.forward import ForwardTask
    from pytest_neuron_support.tasks.table import TASKS

    tasks = {
        TEXT_GENERATION: CensusTask(
            TEXT_GENERATION,
            "AutoModelForCausalLM",
            "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
            TEXT_GENERATION,
            "prompt",
            _TOKENIZER,
            "logits",
            _CAUSAL,
        ),
        TEXT2TEXT: CensusTask(
            TEXT2TEXT,
            "AutoModelForSeq2SeqLM",
            "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
            TEXT2TEXT,
            "seq2seq",
            _TOKENIZER,
            "logits",
            _SEQ2SEQ,
        ),
    }
    for task in TASKS.values():
        if isinstance(task, ForwardTask) and task.registry is not None:
            reading = task.reading
            tasks[task.name] = CensusTask(
                task.name,
                task.auto_class,
                task.registry[1],
                task.pipeline_tag,
                reading.inputs,
                reading.preprocessor or _TOKENIZER,
                reading.output,
                _FORWARD,
            )
    return tasks


def census_task(name: str) -> CensusTask:
    """The census's row for task ``name``; a ValueError naming the tasks it has for any other."""
    tasks = census_tasks()
    if name not in tasks:
        raise ValueError(f"the census has no task {name!r}: one of {', '.join(tasks)}")
    return tasks[name]


def census_architectures(task: str = TEXT_GENERATION) -> tuple[str, ...]:
    """Every model_type of the installed transformers' registry for ``task`` (the causal-LM mapping for text
    generation), sorted."""
    return tuple(sorted(_model_classes(census_task(task))))


def _model_classes(task: CensusTask) -> Mapping[str, str]:
    """model_type -> the task's class name, from transformers' auto mapping (names only: no import); a value
    naming several heads (DeiT's two image classifiers) is read as all of them, as coverage reads it."""
    from pytest_neuron_support.catalog.coverage import class_names

    mapping: Mapping[str, object] = getattr(
        importlib.import_module("transformers.models.auto.modeling_auto"), task.registry
    )
    return {k: class_names(v) for k, v in mapping.items()}


def _census_fingerprint(task: CensusTask) -> str:
    """Short hash of what a census model depends on: this module's rules and :data:`CENSUS_VERSION`,
    the transformers and torch versions that define and save the architectures, and the zoo
    tokenizer's definition (its vocabulary size is every model's vocab_size); for a task other than text
    generation also the task's row (its class, inputs and preprocessor) and the size images are resized to."""
    import torch

    transformers = _transformers()
    spec: dict[str, Any] = {
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
    if task.name != TEXT_GENERATION:
        # Text generation's fingerprint stays what it was before the census had tasks: its models are reused.
        spec["task"] = {**dataclasses.asdict(task), "shrinking": task.shrinking.to_json()}
        spec["media"] = {"image_size": _MEDIA_IMAGE_SIZE, "sizes": list(_IMAGE_SIZE_FIELDS), "backend": _IMAGE_BACKEND}
        spec["mask_token"] = _FORWARD_TRAIN["mask_token"]
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
    d: dict[str, Any],
    config_class: type,
    vocab_size: int,
    ids: Mapping[str, int],
    per_kind: int,
    shrinking: Shrinking,
) -> dict[str, Any]:
    """Shrink one config's own fields in place (its sub-configs are shrunk by the caller, each with
    its own class) and return it."""
    aliases = _aliases(config_class)
    common = {**_SIZE_RULES, **shrinking.rules}
    rules: dict[str, int] = {**{real: common[alias] for alias, real in aliases.items() if alias in common}, **common}
    depth_field = next(
        (f for f in (aliases.get("num_hidden_layers", "num_hidden_layers"), *_DEPTH_FIELDS) if _is_int(d.get(f))),
        None,
    )
    width = d.get(aliases.get("hidden_size", "hidden_size"))
    new_depth = _LAYERS
    depth = d[depth_field] if depth_field is not None else 0
    cut = depth > _LAYERS
    if cut:
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
    for key, flag in shrinking.flags.items():
        if isinstance(d.get(key), bool):
            d[key] = flag
    for key in shrinking.derived if cut else ():
        d.pop(key, None)
    # The zoo tokenizer's vocabulary and special tokens, under whatever name the config keeps them
    # (xlm's n_words is an alias of vocab_size); a None pad becomes the tokenizer's pad.
    attribute_map: Mapping[str, str] = getattr(config_class, "attribute_map", {}) or {}
    tokens = {
        **dict.fromkeys(_VOCAB_FIELDS, vocab_size),
        "bos_token_id": ids[_BOS],
        "eos_token_id": ids[_EOS],
        "pad_token_id": ids[_PAD],
        **({"decoder_start_token_id": ids[_PAD]} if shrinking.decoder_start else {}),
    }
    for name, value in tokens.items():
        key = attribute_map.get(name, name)
        if key in d and not isinstance(d[key], bool) and (d[key] is not None or name.endswith("_token_id")):
            d[key] = value
    return d


def _shrunk_config(
    model_type: str, vocab_size: int, ids: Mapping[str, int], per_kind: int = 1, shrinking: Shrinking = _CAUSAL
) -> Any:
    """The default config of ``model_type``, shrunk by the rules, its sub-configs (text, vision,
    audio, ...) likewise, rebuilt through the config class so its own validation runs.  ``per_kind``:
    how many layers of each layer kind to keep; ``shrinking``: the task's own (:attr:`CensusTask.shrinking`)."""
    auto = _transformers().AutoConfig
    default = auto.for_model(model_type)
    if (
        shrinking.own_backbone
        and getattr(getattr(default, "backbone_config", None), "model_type", "") == "timm_backbone"
    ):
        default = auto.for_model(model_type, use_timm_backbone=False)
    return _shrink_config_object(default, vocab_size, ids, per_kind, shrinking)


def _shrink_config_object(
    config: Any, vocab_size: int, ids: Mapping[str, int], per_kind: int, shrinking: Shrinking
) -> Any:
    pretrained_config = _transformers().PretrainedConfig
    d: dict[str, Any] = copy.deepcopy(config.to_dict())
    # vars(), not getattr(): a config with per-layer overrides (gemma4) refuses to read per-layer
    # fields globally.
    for key, sub in vars(config).items():
        if key in d and isinstance(sub, pretrained_config):
            d[key] = _shrink_config_object(sub, vocab_size, ids, per_kind, shrinking).to_dict()
    d = _shrink_dict(d, type(config), vocab_size, ids, per_kind, shrinking)
    return type(config).from_dict(d)


# ----------------------------------------------------------------------------------------------------
# Building one architecture
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CensusBuild:
    """The outcome of one architecture of the census.

    Attributes:
        model_type: the transformers ``model_type``.
        repo_id: where it is installed when built (:meth:`CensusTask.repo_id`: ``census/<model_type>`` or
            ``census-<task>/<model_type>``), None when not.
        model_class: the task registry's class name for it, e.g. ``LlamaForCausalLM``.
        parameters: the shrunk model's parameter count (None when it never got that far).
        step: where the build failed: ``preprocessor``, ``config``, ``model``, ``forward``, ``save`` or
            ``load``; None when built.
        error: ``"ExcType: first line of the message"`` (at most ~300 characters); None when built.
        task: the task it was built for (:func:`census_tasks`).
    """

    model_type: str
    repo_id: str | None
    model_class: str
    parameters: int | None
    step: str | None
    error: str | None
    task: str = TEXT_GENERATION


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


def _output(model: Any, batch: Mapping[str, Any], name: str) -> Any:
    """The model's output ``name`` for ``batch`` (its first output where it has no such attribute), as float32."""
    import torch

    with torch.no_grad():
        out = model(**batch)
    value = getattr(out, name, None)
    if value is None:
        value = out[0]
    return value.float()


def _count_parameters(task: CensusTask, config: Any) -> int:
    """The parameter count of ``config``'s model for ``task``, from an instance on the meta device: nothing is
    allocated, so a config the rules failed to shrink cannot take the machine's memory."""
    import torch

    with torch.device("meta"):
        model = getattr(_transformers(), task.auto_class).from_config(config)
    return sum(p.numel() for p in model.parameters())


def _media_preprocessor(task: CensusTask, model_type: str, tokenizer: Any) -> Any:
    """The architecture's own image processor or feature extractor, as transformers maps it to ``model_type``,
    with its defaults (an image processor's sizes set to :data:`_MEDIA_IMAGE_SIZE`); with ``tokenizer`` beside it in
    the architecture's processor where the task loads an ``AutoProcessor`` (a CLIP-style model takes both)."""
    auto = importlib.import_module("transformers.models.auto")
    transformers = _transformers()
    if task.inputs == "image":
        backends: Mapping[str, str] = auto.image_processing_auto.IMAGE_PROCESSOR_MAPPING_NAMES.get(model_type) or {}
        name = backends.get(_IMAGE_BACKEND) or next(iter(backends.values()), None)
    else:
        name = auto.feature_extraction_auto.FEATURE_EXTRACTOR_MAPPING_NAMES.get(model_type)
    if name is None:
        raise ValueError(f"transformers maps no {task.inputs} preprocessor to {model_type!r}")
    made = getattr(transformers, name)()
    sizes = {}
    for attribute in ("size", "crop_size"):
        default = getattr(made, attribute, None)
        fields = {k: _MEDIA_IMAGE_SIZE for k in _IMAGE_SIZE_FIELDS if getattr(default, k, None) is not None}
        if fields:
            sizes[attribute] = fields
    if sizes:
        made = getattr(transformers, name)(**sizes)
    if task.preprocessor != "AutoProcessor":
        return made
    processor = auto.processing_auto.PROCESSOR_MAPPING_NAMES.get(model_type)
    if processor is None:
        raise ValueError(f"transformers maps no processor to {model_type!r}")
    kind = "feature_extractor" if task.inputs == "audio" else "image_processor"
    return getattr(transformers, processor)(**{kind: made}, tokenizer=tokenizer)


def _inputs(
    task: CensusTask, model_type: str, tokenizer: _HFTokenizer, tokenizer_dir: Path, out_dir: Path
) -> tuple[dict[str, Any], int]:
    """What the model of ``task`` is fed, and the vocabulary size its config takes; its preprocessor's files are
    saved into ``out_dir`` as a Hub repo ships them. A causal LM: the zoo tokenizer's prompt (an encoder-decoder:
    on the encoder side, the decoder's start token on the other). A forward task:
    run.py's own inputs (its template's ``forward_batch``, so exactly what every run of the row feeds), made by the
    preprocessor loaded back from ``out_dir`` with the row's loader, as run.py loads it."""
    import torch

    from pytest_neuron_support.tasks.table import task_of
    from pytest_neuron_support.zoo.forward import _forward_tokenizer, _run_batch

    if task.generates:
        for f in tokenizer_dir.iterdir():
            shutil.copyfile(f, out_dir / f.name)
        batch = {"input_ids": _prompt_ids(tokenizer), "use_cache": False}
        if task.inputs == "seq2seq":
            batch["decoder_input_ids"] = torch.tensor([[int(tokenizer.convert_tokens_to_ids(_PAD))]])
        return batch, len(tokenizer)
    # The zoo tokenizer with a mask token and RoBERTa's framing: the text rows' (and a CLIP text tower's) tokenizer.
    text = (
        _forward_tokenizer(tokenizer_dir, out_dir)
        if task.inputs == "text" or task.preprocessor == "AutoProcessor"
        else None
    )
    if task.inputs != "text":
        _media_preprocessor(task, model_type, text).save_pretrained(out_dir)
    loaded = getattr(_transformers(), task.preprocessor).from_pretrained(str(out_dir))
    batch, _ = _run_batch(torch, task_of(task.name), loaded)
    return dict(batch), len(text) if text is not None else len(tokenizer)


def _model_card(
    task: CensusTask, model_type: str, model_class: str, config: Any, parameters: int, fingerprint: str
) -> str:
    """The model card: text generation's exactly as before the census had tasks (its installed models stay
    byte for byte what they were), another task's naming the task and how its inputs are made."""
    version = _transformers().__version__
    causal = task.name == TEXT_GENERATION
    inputs = (
        "the zoo tokenizer's\nvocabulary"
        if causal
        else (
            "the zoo tokenizer's vocabulary"
            if task.generates
            else f"run.py's {task.inputs} inputs for `{task.name}`\nthrough transformers' {task.preprocessor} for it"
        )
    )
    return (
        "---\n"
        "library_name: transformers\n"
        f"pipeline_tag: {task.pipeline_tag}\n"
        f"tags: [tiny-random, test, census, {model_type}]\n"
        f"census_fingerprint: {fingerprint}\n"
        f"census_model_class: {model_class}\n"
        f"census_parameters: {parameters}\n" + ("" if causal else f"census_task: {task.name}\n") + "---\n\n"
        f"# {task.repo_id(model_type)}\n\n"
        "Random weights, built offline by the census (`pytest_neuron_support.zoo.census`) from\n"
        f"transformers {version}'s default `{type(config).__name__}` shrunk: width {_HIDDEN}, MLP {_INTER},\n"
        f"{_HEADS} heads of {_HEAD_DIM}, {_LAYERS} layers or one of each layer kind, 4 experts, {inputs}. "
        f"A `{model_class}` of {parameters:,} parameters.\n\n"
        + ("Not a language model" if causal else "Not a trained model")
        + ": it shows that the architecture builds, runs, saves and loads, nothing more.\n"
    )


def _checked_model(
    task: CensusTask, model_type: str, ids: Mapping[str, int], vocab_size: int, batch: Mapping[str, Any]
) -> tuple[Any, Any, Any, int]:
    """The shrunk config, its random-initialised model (float32, the architecture's own seed), its output for
    ``batch`` and the parameter count; raises :class:`_StepFailed`.

    Keeping one layer of each kind is tried first; where that fails, two of each (zamba ties the
    weights of its hybrid layers together, which takes at least two of them).  The first failure is
    the one reported."""
    first: _StepFailed | None = None
    previous: dict[str, Any] | None = None
    for per_kind in (1, 2):
        try:
            with _step("config"):
                config = _shrunk_config(model_type, vocab_size, ids, per_kind, task.shrinking)
                shape = config.to_dict()
            if shape == previous:
                break  # keeping more layers changed nothing: it would fail the same way
            previous = shape
            return (config, *_instantiate(task, model_type, config, batch))
        except _StepFailed as failed:
            first = first or failed
    assert first is not None
    raise first


def _instantiate(task: CensusTask, model_type: str, config: Any, batch: Mapping[str, Any]) -> tuple[Any, Any, int]:
    import torch

    with _step("model"):
        parameters = _count_parameters(task, config)
    if parameters > _MAX_PARAMETERS:
        raise _StepFailed("model", f"too large after shrinking: {parameters} params", parameters)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed := _census_seed(task.repo_id(model_type)))
        with _step("model", parameters):
            model = getattr(_transformers(), task.auto_class).from_config(config, dtype=torch.float32)
            model.eval()
        with _step("forward", parameters):
            # Seeded again right before the pass, as the reload check's is: a forward pass that draws random
            # numbers (ViT-MAE's random masking) gives the same output both times.
            torch.manual_seed(seed)
            output = _output(model, batch, task.output)
            if not bool(torch.isfinite(output).all()):
                raise ValueError(f"the forward pass gave non-finite {task.output}")
    return model, output, parameters


def _build_one(
    task: CensusTask,
    model_type: str,
    model_class: str,
    tokenizer: _HFTokenizer,
    tokenizer_dir: Path,
    cache_dir: Path,
    fingerprint: str,
    work_dir: Path,
) -> int:
    """Build, check, save and install one architecture's model for ``task``; returns its parameter count or
    raises :class:`_StepFailed` (and then leaves nothing of it in the cache)."""
    import torch

    transformers = _transformers()

    ids = _token_ids(tokenizer)
    out_dir = work_dir / task.name / model_type
    out_dir.mkdir(parents=True)
    repo_id = task.repo_id(model_type)
    try:
        with _step("preprocessor"):
            batch, vocab_size = _inputs(task, model_type, tokenizer, tokenizer_dir, out_dir)
        config, model, output, parameters = _checked_model(task, model_type, ids, vocab_size, batch)
        with _step("save", parameters):
            model.save_pretrained(str(out_dir))
            if task.generates:
                # The model class's own generation defaults (minus transformers' bookkeeping), made greedy
                # and given the zoo tokenizer's special tokens (an encoder-decoder's decoder starts at its pad).
                defaults = model.generation_config.to_diff_dict()
                generation = {
                    **{k: v for k, v in defaults.items() if not k.startswith("_")},
                    "bos_token_id": ids[_BOS],
                    "do_sample": False,
                    "eos_token_id": [ids[_EOS], ids[_IM_END]],
                    "pad_token_id": ids[_PAD],
                    **({"decoder_start_token_id": ids[_PAD]} if task.shrinking.decoder_start else {}),
                }
                write_atomic(
                    out_dir / "generation_config.json", json.dumps(generation, indent=2, sort_keys=True) + "\n"
                )
            card = _model_card(task, model_type, model_class, config, parameters, fingerprint)
            write_atomic(out_dir / "README.md", card)
            snapshot = install_snapshot(cache_dir, repo_id, out_dir)
        del model
        with _step("load", parameters):
            reloaded = getattr(transformers, task.auto_class).from_pretrained(str(snapshot), dtype=torch.float32)
            reloaded.eval()
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(_census_seed(repo_id))
                again = _output(reloaded, batch, task.output)
            if again.shape != output.shape or not torch.allclose(again, output, atol=1e-4, rtol=1e-4):
                diff = (again - output).abs().max().item() if again.shape == output.shape else "shape"
                raise ValueError(f"the reloaded model's {task.output} differ from the built one's (max |diff| {diff})")
            getattr(transformers, task.preprocessor).from_pretrained(str(snapshot))
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
    task: str = TEXT_GENERATION,
    progress: Callable[[CensusBuild], None] | None = None,
) -> list[CensusBuild]:
    """Build (or reuse, when already installed with the same fingerprint) each architecture's tiny model for
    ``task`` into cache_dir; one CensusBuild per model_type in order; never raises for one architecture's failure.

    ``model_types`` defaults to :func:`census_architectures` of the task; one the task's registry does not map is
    reported as failing at the ``config`` step.  ``progress`` is called with each result as it is known.  Builds
    run one at a time on one thread, offline, under a lock in ``<cache_dir>/.locks``; the zoo tokenizer is trained
    once per call, and only if something is left to build.  Failures are not cached (they are cheap to find
    again); an architecture that fails leaves no model in the cache, not even one an earlier fingerprint built.
    """
    from filelock import FileLock

    cache_dir = Path(cache_dir)
    target = census_task(task)
    wanted = list(census_architectures(task) if model_types is None else model_types)
    classes = _model_classes(target)
    fingerprint = _census_fingerprint(target)
    results: list[CensusBuild] = []
    (cache_dir / ".locks").mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        # Another process building the census into the same cache waits: no two builders install,
        # or remove, the same repo at once.
        stack.enter_context(FileLock(str(cache_dir / ".locks" / "census.lock")))
        tools: tuple[_HFTokenizer, Path, Path] | None = None
        for model_type in wanted:
            repo_id = target.repo_id(model_type)
            model_class = classes.get(model_type, "")
            card = _installed_card(cache_dir, repo_id)
            if card.get("census_fingerprint") == fingerprint and card.get("census_parameters", "").isdigit():
                parameters = int(card["census_parameters"])
                result = CensusBuild(model_type, repo_id, model_class, parameters, None, None, task)
            elif not model_class:
                error = f"KeyError: {model_type!r} is not a model_type of {target.registry}"
                result = CensusBuild(model_type, None, "", None, "config", error, task)
            else:
                if tools is None:
                    tools = _enter_build(stack)
                tokenizer, tokenizer_dir, work_dir = tools
                try:
                    parameters = _build_one(
                        target, model_type, model_class, tokenizer, tokenizer_dir, cache_dir, fingerprint, work_dir
                    )
                    result = CensusBuild(model_type, repo_id, model_class, parameters, None, None, task)
                except Exception as exc:  # one architecture's failure, whatever it is, must not stop the census
                    failed = exc if isinstance(exc, _StepFailed) else _StepFailed("model", _describe(exc))
                    result = CensusBuild(
                        model_type, None, model_class, failed.parameters, failed.step, failed.error, task
                    )
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
