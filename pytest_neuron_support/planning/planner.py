"""The NeuronCore planner: how many cores a model needs, and how it is sharded over them.

Each model runs on the fewest NeuronCores whose memory holds its weights. The planner needs two
facts about a model, both obtained without downloading a single weight:

* its **shape** (:class:`ModelShape`): attention heads, KV heads, experts and whether transformers
  knows how to tensor-parallelise it, read from ``config.json`` through transformers' own config
  classes so that legacy spellings (gpt2's ``n_head``) and nested VLM text configs are normalised;
* its **parameter count**, read from safetensors headers (local files or the Hugging Face cache)
  or, failing that, from the Hub's safetensors metadata API.

:func:`plan_cores` then applies the memory and divisibility rules and returns a :class:`Plan`,
which either says how many cores to lease and with which tensor/expert-parallel sizes, or says
why the model cannot run within the limits and what it would take.

Every Hub call goes through :mod:`.hub`; torch and transformers are imported inside the functions that
use them: this module is imported by the pytest plugin at collection time, and ``pytest --help`` must stay fast.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import math
import os
import re
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pytest_neuron_support import hub
from pytest_neuron_support.base.model import CORE_COUNTS, ModelSpec
from pytest_neuron_support.base.storage import cache_home, write_atomic
from pytest_neuron_support.devices.table import TRN2_LOGICAL_CORE_BYTES

GIB = 1 << 30

# Core counts a model may be sharded over (base.model.CORE_COUNTS, the catalog's `cores:` rule too). Powers
# of two because tensor parallelism splits heads evenly and the Neuron runtime allocates contiguous core
# ranges of these sizes.
CORE_CHOICES: tuple[int, ...] = CORE_COUNTS
DEFAULT_MAX_CORES = 16

# Weights are not the only tenant of a core's HBM. generate() allocates a static KV cache, the
# compiled graphs need activations and the Neuron runtime's scratchpad, the NEFF instructions
# themselves live in device memory, and sharded runs add collective-communication buffers. None of
# these is known before compiling, so a quarter of each core is kept free: a margin chosen to be
# safe for short-prompt, 32-token checks rather than measured; pass ``headroom`` to change it.
DEFAULT_HEADROOM = 0.25

# Bytes per parameter on the device. Weights are cast to the catalog dtype at load time, so the
# stored dtype (F32, FP8, ...) does not matter, only the one the model will run in.
DTYPE_BYTES: Mapping[str, int] = MappingProxyType({"bfloat16": 2, "float16": 2, "float32": 4})

# Config attributes that hold the number of routed experts, across transformers' MoE families
# (qwen*_moe/olmoe: num_experts; mixtral/jetmoe/gpt_oss: num_local_experts; deepseek*: n_routed_experts).
_EXPERT_KEYS: tuple[str, ...] = ("num_experts", "num_local_experts", "n_routed_experts")
# Raw config.json spellings, for model types transformers does not know (remote-code models).
_HEAD_KEYS: tuple[str, ...] = ("num_attention_heads", "n_head", "n_heads", "num_heads")
_KV_HEAD_KEYS: tuple[str, ...] = ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "n_head_kv")

# The safetensors library refuses headers above 100 MB; a larger length prefix means the file is
# corrupt or not safetensors at all, and reading it would allocate that much memory for nothing.
_MAX_HEADER_BYTES = 100_000_000


class PlanningError(Exception):
    """The model cannot be inspected (no config, no weights metadata); the message says what was tried.

    ``unreachable`` is True when the Hub itself could not be reached, so callers can stop asking it.
    """

    unreachable: bool = False


@dataclass(frozen=True)
class ModelShape:
    """What the planner needs to know about a model, read from its config and weights metadata.

    Attributes:
        model_type: ``config.json``'s ``model_type`` (the top-level one for VLMs, e.g. ``gemma3``).
        num_attention_heads: query heads of the language model (the text config for VLMs); 0 if unknown.
        num_key_value_heads: KV heads; equal to ``num_attention_heads`` for models without GQA/MQA.
        num_experts: routed experts per MoE layer; 0 for dense models.
        has_tp_plan: transformers' config class (the text config for VLMs) has a non-empty
            ``base_model_tp_plan``, i.e. transformers can shard it with tensor parallelism.
        parameters: total parameter count, all dtypes, of the weights as loaded: the safetensors
            files' elements, with packed MXFP4 weights counted unpacked (:func:`tensor_parameters`).
        expert_parameters: the part of ``parameters`` in routed experts (tensors named
            ``...experts.<...>``; shared experts are dense): what expert parallelism shards. Counted
            from the safetensors tensor names, or estimated from the config when only a total is known.
        weights_source: where ``parameters`` came from: ``local files``, ``hub cache``, ``hub api``,
            or ``given`` when the caller supplied it.
    """

    model_type: str
    num_attention_heads: int
    num_key_value_heads: int
    num_experts: int
    has_tp_plan: bool
    parameters: int
    weights_source: str
    expert_parameters: int = 0

    @classmethod
    def from_config(
        cls,
        config: Mapping[str, Any],
        parameters: int,
        weights_source: str = "given",
        expert_parameters: int | None = None,
        cache: Path | None = None,
    ) -> ModelShape:
        """Build a shape from a ``config.json`` mapping and a parameter count.

        The config's heads, experts and TP plan are transformers' reading of it (:func:`config_facts`,
        kept in ``cache`` when given). ``expert_parameters`` None estimates the experts' share from
        the config (:func:`estimate_expert_parameters`).
        """
        model_type = config.get("model_type")
        if not isinstance(model_type, str) or not model_type:
            raise PlanningError("config.json has no 'model_type', so the architecture cannot be identified")
        if isinstance(parameters, bool) or not isinstance(parameters, int) or parameters < 0:
            raise PlanningError(f"parameter count must be a non-negative integer (got {parameters!r})")
        facts = config_facts(config, cache)
        if expert_parameters is None:
            expert_parameters = facts.expert_estimate
        return cls(
            model_type=model_type,
            num_attention_heads=facts.heads,
            num_key_value_heads=facts.kv_heads,
            num_experts=facts.experts,
            has_tp_plan=facts.has_tp_plan,
            parameters=parameters,
            weights_source=weights_source,
            expert_parameters=min(expert_parameters, parameters),
        )


#: Where :func:`config_facts` keeps what it read: this variable, else the ``config-facts`` folder
#: of the cache home (:func:`.storage.cache_home`); ``none`` keeps nothing.
CONFIG_CACHE_ENV = "NEURON_SUPPORT_CONFIG_CACHE"

#: Bumped when :class:`ConfigFacts` or the way it is read changes, so older entries are misses.
CONFIG_FACTS_FORMAT = 1


@dataclass(frozen=True)
class ConfigFacts:
    """transformers' reading of one ``config.json``: the part of a :class:`ModelShape` the config decides.

    The config class is built from the mapping so its attribute map normalises legacy names (gpt2's
    ``n_head``) and its defaults fill absent keys (a missing ``num_key_value_heads`` means no GQA).
    For VLMs the heads and the TP plan live in the text config. A ``model_type`` transformers does
    not know, or a config it cannot build, falls back to the raw fields with ``has_tp_plan=False``:
    without transformers' plan there is nothing that would shard the model.

    Attributes:
        known: transformers built its config class from the mapping (False: the raw fields were read).
        heads: query heads of the language model; 0 if unknown.
        kv_heads: KV heads; ``heads`` for models without GQA/MQA.
        experts: routed experts per MoE layer; 0 for dense models.
        has_tp_plan: the (text) config class has a non-empty ``base_model_tp_plan``.
        expert_estimate: :func:`estimate_expert_parameters` over the config with the class's
            defaults filled in; 0 for dense models.
    """

    known: bool
    heads: int
    kv_heads: int
    experts: int
    has_tp_plan: bool
    expert_estimate: int


def config_cache_dir(environ: Mapping[str, str] = os.environ) -> Path | None:
    """Where config facts are kept (:data:`CONFIG_CACHE_ENV`), None when nothing is to be kept."""
    override = environ.get(CONFIG_CACHE_ENV)
    if override:
        return None if override == "none" else Path(override).expanduser()
    return cache_home(environ).expanduser() / "config-facts"


def config_facts(config: Mapping[str, Any], cache: Path | None = None) -> ConfigFacts:
    """transformers' reading of ``config`` (:class:`ConfigFacts`), from ``cache`` when it holds it.

    Reading builds transformers' config class, and importing transformers imports torch: 3 to 5 s
    of CPU in every session that plans, where planning itself takes milliseconds. An entry is keyed
    by the whole config and the installed transformers version (and :data:`CONFIG_FACTS_FORMAT`),
    so a hit is what reading would give; an unreadable entry is read afresh and replaced."""
    if cache is None:
        return _read_config_facts(config)
    parts = {"format": CONFIG_FACTS_FORMAT, "transformers": _transformers_version(), "config": config}
    key = hashlib.sha256(json.dumps(parts, sort_keys=True, default=repr).encode()).hexdigest()[:32]
    path = cache / f"{key}.json"
    with contextlib.suppress(OSError, ValueError, TypeError):
        stored = json.loads(path.read_text(encoding="utf-8"))
        # Field types are annotations written as text ("int", "bool"): an entry of other types is not one.
        kinds = {field.name: field.type for field in dataclasses.fields(ConfigFacts)}
        if (
            isinstance(stored, dict)
            and stored.keys() == kinds.keys()
            and all(type(stored[name]).__name__ == kind for name, kind in kinds.items())
        ):
            return ConfigFacts(**stored)
    facts = _read_config_facts(config)
    # A cache that cannot be written (read-only home, full disk) only costs the next session the read.
    with contextlib.suppress(OSError):
        write_atomic(path, json.dumps(dataclasses.asdict(facts)))
    return facts


@functools.cache
def _transformers_version() -> str:
    # Read once per process: importlib.metadata scans every installed distribution, per model otherwise.
    try:
        return importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _read_config_facts(config: Mapping[str, Any]) -> ConfigFacts:
    text = _transformers_text_config(str(config.get("model_type")), config)
    if text is None:
        raw = config.get("text_config")
        fields: Mapping[str, Any] = raw if isinstance(raw, Mapping) else config
        heads = _first_positive(fields.get(key) for key in _HEAD_KEYS)
        kv_heads = _first_positive(fields.get(key) for key in _KV_HEAD_KEYS) or heads
        experts = _first_positive(fields.get(key) for key in _EXPERT_KEYS)
        has_tp_plan = False
        source = fields
    else:
        heads = _first_positive([getattr(text, "num_attention_heads", None)])
        kv_heads = _first_positive([getattr(text, "num_key_value_heads", None)]) or heads
        experts = _first_positive(getattr(text, key, None) for key in _EXPERT_KEYS)
        has_tp_plan = bool(getattr(text, "base_model_tp_plan", None))
        source = vars(text)  # transformers' config object fills the defaults a config.json leaves out
    return ConfigFacts(
        known=text is not None,
        heads=heads,
        kv_heads=kv_heads,
        experts=experts,
        has_tp_plan=has_tp_plan,
        expert_estimate=estimate_expert_parameters(source, experts) if experts else 0,
    )


#: A tensor of a routed expert: ``...mlp.experts.3.down_proj.weight`` (qwen*_moe, deepseek),
#: ``...block_sparse_moe.experts.0.w1.weight`` (mixtral), ``...mlp.experts.gate_up_proj`` (gpt_oss,
#: fused). ``shared_experts`` (deepseek) run on every token and are not sharded by expert parallelism.
_EXPERT_TENSOR = re.compile(r"(^|\.)experts\.")


def is_expert_tensor(name: str) -> bool:
    """Whether a weight belongs to a routed expert (what expert parallelism splits over ranks)."""
    return _EXPERT_TENSOR.search(name) is not None


def estimate_expert_parameters(config: Mapping[str, Any], experts: int) -> int:
    """Routed-expert parameters from a config alone: MoE layers x experts x 3 projections (gate, up,
    down) x hidden x the expert width (``moe_intermediate_size``, else ``intermediate_size``). MoE
    layers are all layers but ``first_k_dense_replace`` leading dense ones (deepseek) and
    ``mlp_only_layers`` (qwen*_moe), every ``decoder_sparse_step``-th. 0 when a field is missing."""
    layers = _first_positive([config.get("num_hidden_layers")])
    hidden = _first_positive([config.get("hidden_size")])
    width = _first_positive([config.get("moe_intermediate_size"), config.get("intermediate_size")])
    if not (layers and hidden and width and experts):
        return 0
    dense_layers = _first_positive([config.get("first_k_dense_replace")])
    only_mlp = config.get("mlp_only_layers") or []
    step = _first_positive([config.get("decoder_sparse_step")]) or 1
    moe_layers = max(0, (layers - dense_layers - (len(only_mlp) if isinstance(only_mlp, list) else 0)) // step)
    return moe_layers * experts * 3 * hidden * width


@dataclass(frozen=True)
class Plan:
    """Where one model runs: how many cores, and how it is sharded over them.

    Attributes:
        cores: NeuronCores to lease; 0 when the model is skipped.
        tp_size: tensor-parallel size (1 = none).
        ep_size: expert-parallel size (1 = none).
        reason: one sentence saying why this many cores, with the numbers, e.g. "16.4 GiB of
            bfloat16 weights need 2 cores of 18.0 usable GiB; tp=2 divides 32 heads and 8 kv heads".
            Starts with "catalog override" when the catalog's ``cores:`` decided. For a skipped
            model it repeats ``skip``.
        skip: None when the model can run; otherwise why it cannot within the limits and what it
            would need, e.g. "needs 32 cores (...), more than --max-cores=16".
        weight_bytes: parameters x bytes of the run dtype: the memory the weights take on the device.
        error: None when the model was planned; otherwise why it could not be inspected (its row is an
            ERROR at stage plan that says what to pass): a plan is never a guess.
        per_core_bytes: what one core holds under this plan (weights, or the training state; an
            expert-parallel rank's dense part whole plus its share of the experts); 0 when the model
            does not run or was not inspected.
        prior_factor: its task's ``prior_factor`` (how many text-generation runs of the same weights
            a run of the task is expected to take): only the sweep's order reads it.
    """

    cores: int
    tp_size: int
    ep_size: int
    reason: str
    skip: str | None
    weight_bytes: int
    error: str | None = None
    per_core_bytes: int = 0
    prior_factor: float = 1.0


def distributed_configs(plan: Plan) -> tuple[dict[str, Any], ...]:
    """``DistributedConfig`` keyword sets run.py tries in order for a sharded plan.

    Which of them loads differs between transformers versions (5.24 on gloo: experts-only
    ``ep_size=n, tp_plan={}`` raises "Pass `tp_plan` in `DistributedConfig`" while
    ``tp_size=n, ep_size=n`` and ``fsdp_size=n, ep_size=n`` work; tests/test_sharded.py keeps this
    premise per release), so run.py detects it and the row records the one used.
    """
    if plan.tp_size > 1:
        return ({"tp_size": plan.tp_size}, {"tp_size": plan.tp_size, "ep_size": plan.tp_size})
    if plan.ep_size > 1:
        n = plan.ep_size
        return ({"ep_size": n, "tp_plan": {}}, {"tp_size": n, "ep_size": n}, {"fsdp_size": n, "ep_size": n})
    return ()


#: The training memory model: a fine-tuning step holds, per parameter, its weight, its gradient and
#: AdamW's two moments (exp_avg, exp_avg_sq), each in the weights' dtype: torch.optim.AdamW makes its
#: state with ``zeros_like(param)``, and Trainer with ``bf16=True`` over bf16 weights keeps no fp32
#: master copy (train.py records the bytes it actually held, ``training_state_bytes``, which the tests
#: compare with this). bfloat16: 4 x 2 = 8 bytes per parameter; float32: 16.
TRAIN_STATE_COPIES = 4


def training_bytes(parameters: int, dtype: str) -> int:
    """Bytes of a training step's state for ``parameters`` in ``dtype``: weights, gradients and the
    optimizer's two moments (:data:`TRAIN_STATE_COPIES` copies); activations live in the headroom."""
    return parameters * DTYPE_BYTES[dtype] * TRAIN_STATE_COPIES


def plan_cores(
    shape: ModelShape,
    *,
    dtype: str,
    core_bytes: int,
    headroom: float = DEFAULT_HEADROOM,
    max_cores: int = DEFAULT_MAX_CORES,
    override: int | None = None,
    training: bool = False,
    limit: str | None = None,
) -> Plan:
    """Choose the fewest cores that hold the weights and that the model's shape can be sharded over.

    A core holds ``core_bytes * (1 - headroom)`` bytes of weights. Sharding over n > 1 cores uses
    tensor parallelism when transformers has a TP plan for the model (n must divide both the
    attention heads and the KV heads, MoE models included), else expert parallelism for an MoE
    (n must divide the experts); a dense model without a TP plan runs on one core only.
    ``override`` (the catalog's ``cores:``) replaces the choice but must satisfy the same rules.
    ``training`` plans a fine-tuning run: a core must hold the training state (:func:`training_bytes`:
    weights, gradients, AdamW moments), not the weights alone. ``limit`` names where ``max_cores``
    comes from in the messages (default ``--max-cores=N``; ``neuron-support plan`` names an instance).
    """
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPE_BYTES)}")
    if core_bytes <= 0:
        raise ValueError(f"core_bytes must be positive (got {core_bytes})")
    if not 0 <= headroom < 1:
        raise ValueError(f"headroom must be in [0, 1) (got {headroom})")
    if max_cores < 1:
        raise ValueError(f"max_cores must be at least 1 (got {max_cores})")

    weight_bytes = shape.parameters * DTYPE_BYTES[dtype]
    copies = TRAIN_STATE_COPIES if training else 1
    usable = core_bytes * (1 - headroom)
    # Expert parallelism without a TP plan shards only the experts: attention, embeddings and the
    # lm_head stay whole on every rank (transformers' ep_size with tp_plan={}), so a core holds
    # dense + experts / n, not weights / n.
    experts_only = not shape.has_tp_plan and shape.num_experts > 0
    expert_bytes = shape.expert_parameters * DTYPE_BYTES[dtype] if experts_only else 0
    held, held_experts = weight_bytes * copies, expert_bytes * copies

    def on_one_core(cores: int) -> float:
        return (held - held_experts) + held_experts / cores if experts_only else held / cores

    need = _memory_cores(on_one_core, usable)
    size = f"{_gib(weight_bytes)} GiB of {dtype} weights"
    if training:
        size = (
            f"{_gib(held)} GiB of training state ({dtype} weights, gradients and AdamW's two moments: "
            f"{copies} x {_gib(weight_bytes)} GiB)"
        )
    if experts_only:
        size += (
            f" ({_gib(held_experts)} GiB in experts, split over the ranks; {_gib(held - held_experts)} GiB "
            "dense, whole on every rank)"
        )
    per_core = f"{_gib(usable)} usable GiB"
    cap = limit or f"--max-cores={max_cores}"

    def skipped(why: str) -> Plan:
        return Plan(cores=0, tp_size=1, ep_size=1, reason=why, skip=why, weight_bytes=weight_bytes)

    if override is not None:
        if override not in CORE_CHOICES:
            choices = ", ".join(map(str, CORE_CHOICES))
            return skipped(f"catalog override cores={override} is not an allowed core count (one of {choices})")
        if override > max_cores:
            return skipped(f"catalog override cores={override} is more than {cap}")
        if on_one_core(override) > usable:
            return skipped(
                f"catalog override cores={override} does not fit memory: {size} need {need} cores "
                f"at {per_core} per core"
            )
        layout = _layout(shape, override, training)
        if isinstance(layout, str):
            return skipped(f"catalog override cores={override} cannot shard {shape.model_type}: {layout}")
        tp, ep, how = layout
        return Plan(
            cores=override,
            tp_size=tp,
            ep_size=ep,
            reason=f"catalog override: {override} cores; {size} fit at {per_core} per core ({need} needed); {how}",
            skip=None,
            weight_bytes=weight_bytes,
            per_core_bytes=math.ceil(on_one_core(override)),
        )

    # Checked before the core limit: raising --max-cores cannot help a model nothing can shard (a
    # training run can: FSDP, see _layout).
    if need > 1 and not shape.has_tp_plan and shape.num_experts == 0 and not training:
        return skipped(
            f"{shape.model_type} has no TP plan in transformers and no experts, so it cannot be sharded and "
            f"must fit 1 core, but its {size} exceed the {per_core} of one core (it would need {need})"
        )
    if need > max_cores:
        return skipped(f"needs {need} cores ({size} at {per_core} per core), more than {cap}")

    # With power-of-two choices a count that breaks divisibility breaks it for every larger count
    # too, but the search does not rely on that: it takes the smallest count passing both rules.
    candidates = [n for n in CORE_CHOICES if need <= n <= max_cores]
    failures: list[str] = []
    for cores in candidates:
        layout = _layout(shape, cores, training)
        if isinstance(layout, str):
            failures.append(layout)
            continue
        tp, ep, how = layout
        if cores == 1:
            memory = f"{size} fit 1 core of {per_core}"
        elif cores == need:
            memory = f"{size} need {cores} cores of {per_core}"
        else:
            memory = f"{size} need {need} cores of {per_core} but the shape needs {cores}"
        return Plan(
            cores=cores,
            tp_size=tp,
            ep_size=ep,
            reason=f"{memory}; {how}",
            skip=None,
            weight_bytes=weight_bytes,
            per_core_bytes=math.ceil(on_one_core(cores)),
        )

    tried = ", ".join(map(str, candidates)) or "none"
    first = failures[0] if failures else "no allowed core count"
    return skipped(
        f"{size} need {need} cores at {per_core} per core, but {first}; no core count that fits memory "
        f"works (tried {tried} with {cap})"
    )


def size_text(nbytes: float) -> str:
    """Bytes as GiB, or MiB below a tenth of one (a tiny-zoo model is not "0.0 GiB")."""
    return f"{nbytes / GIB:.1f} GiB" if nbytes >= GIB / 10 else f"{nbytes / (1 << 20):.1f} MiB"


def describe_plan(plan: Plan) -> str:
    """A plan in words, one line: cores, tp/ep, what one core holds, and the planner's reason; or
    why the model does not run. ``pytest --collect-only -v`` and ``neuron-support plan`` both print it."""
    if plan.error is not None:
        return f"not planned: {plan.error}"
    if plan.skip is not None:
        return f"SKIPPED: {plan.skip}"
    # A catalog ``cores:`` on a model that could not be inspected: the cores are the user's, the size unknown.
    memory = f"{size_text(plan.per_core_bytes)} per core" if plan.per_core_bytes else "memory per core not known"
    return f"{plan.cores} core(s), tp={plan.tp_size} ep={plan.ep_size}, {memory}: {plan.reason}"


@dataclass(frozen=True)
class Instance:
    """A trn2 size ``neuron-support plan`` answers for.

    Attributes:
        name: the EC2 instance type.
        chips: Trainium2 chips.
        cores: logical NeuronCores at the default LNC=2 (4 a chip), each with one 24 GiB HBM bank.
    """

    name: str
    chips: int
    cores: int


TRN2_INSTANCES: tuple[Instance, ...] = (Instance("trn2.3xlarge", 1, 4), Instance("trn2.48xlarge", 16, 64))


def instance_plan(
    shape: ModelShape,
    instance: Instance,
    *,
    dtype: str,
    headroom: float = DEFAULT_HEADROOM,
    max_cores: int = DEFAULT_MAX_CORES,
    override: int | None = None,
    training: bool = False,
) -> Plan:
    """The plan the harness makes for ``shape`` on ``instance``: :func:`plan_cores` with the instance's
    cores as the limit, capped at ``max_cores`` (a model never gets more than 16 cores, whatever the host has)."""
    if instance.cores <= max_cores:
        cap, limit = instance.cores, f"the {instance.cores} cores of a {instance.name}"
    else:
        cap, limit = (
            max_cores,
            f"the harness's {max_cores} cores per model (--max-cores; a {instance.name} has {instance.cores})",
        )
    return plan_cores(
        shape,
        dtype=dtype,
        # One logical core at LNC=2 (a 24 GiB HBM bank): what a neuron device reporting none and cpu plan with.
        core_bytes=TRN2_LOGICAL_CORE_BYTES,
        headroom=headroom,
        max_cores=cap,
        override=override,
        training=training,
        limit=limit,
    )


def inspect_model(model: ModelSpec, *, local_only: bool = False) -> ModelShape:
    """Read a model's config and parameter count without downloading any weights.

    Local checkpoints (``source == "local"``) are read from their directory. Hub models get
    ``config.json`` through ``hf_hub_download`` (served from the cache when offline) and their
    parameter count from, in order: the safetensors headers of shards already in the Hugging Face
    cache, then the Hub's safetensors metadata API. Raises :class:`PlanningError` naming the model
    and everything tried when any of it is unavailable. ``local_only`` asks nothing of the Hub
    (used once the Hub proved unreachable, so a sweep does not wait on retries per model).
    """
    if model.source == "local":
        directory = Path(model.id)
        config = _read_config_file(directory / "config.json", model)
        return _shape(model, config, _local_parameters(directory, model), "local files")

    config = _read_config_file(_hub_config_path(model, local_only), model)
    tried: list[str] = []
    cached = _cached_parameters(model, tried)
    if cached is not None:
        return _shape(model, config, cached, "hub cache")
    if local_only:
        raise PlanningError(f"cannot inspect {label(model)}: no parameter count; tried {'; '.join(tried)}")
    return _shape(model, config, _api_parameters(model, tried), "hub api")


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file, reading only the header bytes, never the tensors.

    The format is an 8-byte little-endian length N followed by N bytes of JSON mapping tensor
    names to ``{"dtype", "shape", "data_offsets"}`` plus an optional ``__metadata__`` entry.
    """
    try:
        with path.open("rb") as handle:
            prefix = handle.read(8)
            if len(prefix) != 8:
                raise PlanningError(f"{path}: too short to be a safetensors file ({len(prefix)} bytes)")
            (length,) = struct.unpack("<Q", prefix)
            if length > _MAX_HEADER_BYTES:
                raise PlanningError(f"{path}: safetensors header length {length} is implausible (corrupt file?)")
            raw = handle.read(length)
    except OSError as exc:
        raise PlanningError(f"{path}: cannot read safetensors header: {exc}") from exc
    if len(raw) != length:
        raise PlanningError(f"{path}: truncated safetensors header ({len(raw)} of {length} bytes)")
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlanningError(f"{path}: safetensors header is not valid JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise PlanningError(f"{path}: safetensors header is not a JSON object")
    return header


#: Suffixes of the two halves of a packed MXFP4 weight (gpt-oss's experts): ``<weight>_blocks`` holds two
#: 4-bit values a byte, ``<weight>_scales`` one shared exponent a 32 values, both stored as U8.
_MXFP4_BLOCKS, _MXFP4_SCALES = "_blocks", "_scales"


def tensor_parameters(name: str, dtype: str, shape: Sequence[int]) -> int:
    """The weights one stored tensor becomes once loaded: its elements, except for packed MXFP4.

    transformers dequantizes an MXFP4 checkpoint to bfloat16 on any device but cuda, xpu and cpu
    (always on neuron; on those three too without the kernels), so the device holds a ``_blocks``
    tensor's bytes as two weights each and no scales. Counting the header's elements instead would
    plan gpt-oss-20b as about 12.0B weights rather than the 20.9B it loads, on too few cores. On a
    device that keeps MXFP4 the count is high by that factor, which errs towards more cores.
    """
    elements = math.prod(shape)
    if dtype == "U8" and name.endswith(_MXFP4_BLOCKS):
        return 2 * elements
    if dtype == "U8" and name.endswith(_MXFP4_SCALES):
        return 0
    return elements


def count_safetensors_parameters(paths: Sequence[Path]) -> int:
    """The weights of every tensor in the given safetensors files (all dtypes, counted by
    :func:`tensor_parameters`), from headers only."""
    return count_safetensors_split(paths)[0]


def count_safetensors_split(paths: Sequence[Path]) -> tuple[int, int]:
    """(all parameters, those in routed-expert tensors) of the given safetensors files, from headers."""
    total = experts = 0
    for path in paths:
        for name, info in read_safetensors_header(path).items():
            if name == "__metadata__":
                continue
            shape = info.get("shape") if isinstance(info, dict) else None
            if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
                raise PlanningError(f"{path}: tensor {name!r} has no valid shape in the safetensors header")
            count = tensor_parameters(name, str(info.get("dtype")), shape)
            total += count
            experts += count if is_expert_tensor(name) else 0
    return total, experts


def _transformers_text_config(model_type: str, config: Mapping[str, Any]) -> Any | None:
    """transformers' (text) config object for ``config``, or None if transformers cannot build one."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        return None
    kwargs = {key: value for key, value in config.items() if key != "model_type"}
    try:
        built = CONFIG_MAPPING[model_type](**kwargs)
    # Config classes validate their own fields with whatever exception they like (ValueError,
    # TypeError, KeyError, ...); any of them means transformers cannot use this config as is.
    except Exception:
        return None
    try:
        return built.get_text_config()
    except ValueError:
        # More than one text config (some encoder-decoder composites): the top level is all we have.
        return built


def _first_positive(values: Any) -> int:
    """The first positive integer among ``values`` (bools excluded), else 0."""
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def _memory_cores(on_one_core: Callable[[int], float], usable: float) -> int:
    """Smallest power of two n with ``on_one_core(n) <= usable``, even beyond the core limit; 1024
    (more than any host has) when no n fits, as with dense weights larger than a core."""
    cores = 1
    while on_one_core(cores) > usable and cores < 1024:
        cores *= 2
    return cores


def _layout(shape: ModelShape, cores: int, training: bool = False) -> tuple[int, int, str] | str:
    """``(tp_size, ep_size, explanation)`` for sharding over ``cores``, or the rule that forbids it.
    A training run of a dense model without a TP plan shards with FSDP instead (tp = ep = 1 over
    ``cores`` ranks: ``DistributedConfig(fsdp_size=cores)`` splits weights, gradients and optimizer
    state, whatever the shape)."""
    if cores == 1:
        return 1, 1, "no sharding needed"
    if shape.has_tp_plan:
        heads, kv = shape.num_attention_heads, shape.num_key_value_heads
        if heads > 0 and kv > 0 and heads % cores == 0 and kv % cores == 0:
            return cores, 1, f"tp={cores} divides {heads} heads and {kv} kv heads"
        return (
            f"tensor parallelism needs tp={cores} to divide both the {heads} attention heads "
            f"and the {kv} kv heads of {shape.model_type}"
        )
    if shape.num_experts > 0:
        experts = shape.num_experts
        if experts % cores == 0:
            return 1, cores, f"ep={cores} divides {experts} experts ({shape.model_type} has no TP plan)"
        return (
            f"expert parallelism ({shape.model_type} has no TP plan) needs ep={cores} to divide the {experts} experts"
        )
    if training:
        return 1, 1, f"fsdp={cores} shards the training state ({shape.model_type} has no TP plan and no experts)"
    return (
        f"{shape.model_type} has no TP plan in transformers and no experts, so it cannot be sharded over {cores} cores"
    )


def _gib(nbytes: float) -> str:
    return f"{nbytes / GIB:.1f}"


def label(model: ModelSpec) -> str:
    return model.id if model.source == "local" else f"{model.id} (revision {model.revision})"


def brief(exc: BaseException) -> str:
    """First line of an exception: hub errors carry multi-line help that would swamp a skip message."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def _shape(model: ModelSpec, config: Mapping[str, Any], counts: tuple[int, int], source: str) -> ModelShape:
    """The shape from a config and (all parameters, those in routed experts)."""
    try:
        return ModelShape.from_config(config, counts[0], source, expert_parameters=counts[1], cache=config_cache_dir())
    except PlanningError as exc:
        raise PlanningError(f"cannot inspect {label(model)}: {exc}") from exc


def _read_config_file(path: Path, model: ModelSpec) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlanningError(f"cannot inspect {label(model)}: no config.json at {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlanningError(f"cannot inspect {label(model)}: cannot read {path}: {exc}") from exc
    if not isinstance(config, dict):
        raise PlanningError(f"cannot inspect {label(model)}: {path} is not a JSON object")
    return config


def _local_parameters(directory: Path, model: ModelSpec) -> tuple[int, int]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        # The index names the shards that make up the model; other *.safetensors files in the
        # directory (leftovers of an earlier save) would be counted twice.
        shards = _index_shards(index, model)
        missing = [name for name in shards if not (directory / name).is_file()]
        if missing:
            raise PlanningError(
                f"cannot inspect {label(model)}: {index.name} names shards missing from {directory}: "
                f"{', '.join(missing)}"
            )
        paths = [directory / name for name in shards]
    else:
        paths = sorted(directory.glob("*.safetensors"))
    if not paths:
        raise PlanningError(
            f"cannot inspect {label(model)}: no *.safetensors files in {directory} to count parameters "
            "(other weight formats are not inspected)"
        )
    try:
        return count_safetensors_split(paths)
    except PlanningError as exc:
        raise PlanningError(f"cannot inspect {label(model)}: {exc}") from exc


def _index_shards(index: Path, model: ModelSpec) -> list[str]:
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        shards = sorted({str(name) for name in weight_map.values()})
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise PlanningError(f"cannot inspect {label(model)}: unreadable {index}: {exc!r}") from exc
    return shards


def _hub_config_path(model: ModelSpec, local_only: bool = False) -> Path:
    try:
        path = hub.download_file(model.id, "config.json", revision=model.revision, local_only=local_only)
    # The hub raises a zoo of types here (offline and not cached, repository or revision not
    # found, gated, HTTP, OS errors); each means the same thing to the planner.
    except Exception as exc:
        error = PlanningError(
            f"cannot inspect {label(model)}: config.json is neither in the Hugging Face cache nor "
            f"downloadable: {brief(exc)}"
        )
        error.unreachable = hub.is_unreachable(exc)
        raise error from exc
    return path


def _cached_parameters(model: ModelSpec, tried: list[str]) -> tuple[int, int] | None:
    """(parameters, expert parameters) from safetensors files already in the Hugging Face cache, or
    None (noted in ``tried``)."""

    def cached(filename: str) -> Path | None:
        return hub.cached_file(model.id, filename, revision=model.revision)

    try:
        index = cached("model.safetensors.index.json")
        if index is not None:
            shards = _index_shards(index, model)
            paths: list[Path] = []
            for shard in shards:
                path = cached(shard)
                if path is None:
                    tried.append(f"hub cache: shard {shard} named in model.safetensors.index.json is not cached")
                    return None
                paths.append(path)
            return count_safetensors_split(paths)
        single = cached("model.safetensors")
        if single is not None:
            return count_safetensors_split([single])
    # A corrupt cache entry or an unusable cache directory must not stop planning while the Hub
    # API can still answer; what went wrong is kept for the final error message.
    except Exception as exc:
        tried.append(f"hub cache: {brief(exc)}")
        return None
    tried.append("hub cache: neither model.safetensors.index.json nor model.safetensors is cached")
    return None


def _api_parameters(model: ModelSpec, tried: list[str]) -> tuple[int, int]:
    try:
        return hub.safetensors_parameters(
            model.id, revision=model.revision, count=tensor_parameters, is_expert=is_expert_tensor
        )
    # Offline mode, not a safetensors repo, gated, not found, network: all leave no count.
    except Exception as exc:
        tried.append(f"hub api get_safetensors_metadata: {brief(exc)}")
    raise PlanningError(f"cannot inspect {label(model)}: no parameter count; tried {'; '.join(tried)}")
