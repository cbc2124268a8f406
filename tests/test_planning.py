"""The NeuronCore planner: real Hub configs planned by hand, and model inspection from real files.

All plans use a trn2 logical core (LNC=2): 24 GiB of HBM, 25% headroom, so
usable = 24 GiB x 0.75 = 18.0 GiB = 19,327,352,832 bytes per core, at most 16 cores, bfloat16
(2 bytes per parameter). "need" below is the smallest power of two n with weights / n <= 18 GiB.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from pytest_neuron_support.base.model import ModelSpec
from pytest_neuron_support.devices.table import TRN2_LOGICAL_CORE_BYTES as TRN2_CORE_BYTES
from pytest_neuron_support.planning.planner import (
    CORE_CHOICES,
    DEFAULT_HEADROOM,
    DTYPE_BYTES,
    GIB,
    TRN2_INSTANCES,
    ModelShape,
    Plan,
    PlanningError,
    count_safetensors_parameters,
    describe_plan,
    inspect_model,
    instance_plan,
    is_expert_tensor,
    plan_cores,
    read_safetensors_header,
)
from pytest_neuron_support.run.threads import cpu_threads

CONFIGS = Path(__file__).resolve().parent / "fixtures" / "configs"
REPO = Path(__file__).resolve().parent.parent


def fixture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CONFIGS / f"{name}.json").read_text(encoding="utf-8"))
    return data


def real_shape(name: str) -> ModelShape:
    """The shape of a real Hub model: its config.json and its Hub safetensors parameter count."""
    data = fixture(name)
    return ModelShape.from_config(data["config"], sum(data["parameters"].values()), "hub api")


def plan(shape: ModelShape, **kwargs: Any) -> Plan:
    options: dict[str, Any] = {"dtype": "bfloat16", "core_bytes": TRN2_CORE_BYTES}
    options.update(kwargs)
    return plan_cores(shape, **options)


def test_constants() -> None:
    assert CORE_CHOICES == (1, 2, 4, 8, 16)
    assert DEFAULT_HEADROOM == 0.25
    assert dict(DTYPE_BYTES) == {"bfloat16": 2, "float16": 2, "float32": 4}
    assert TRN2_CORE_BYTES == 24 * GIB


# (fixture, cores, tp, ep, skipped, numbers the reason or skip must contain)
PLAN_TABLE = [
    # gpt2: F32 137,022,720 params x 2 B = 274,045,440 B = 0.26 GiB <= 18.0 -> 1 core. It has no TP plan,
    # which does not matter on one core.
    ("openai-community_gpt2", 1, 1, 1, False, ["0.3 GiB", "bfloat16", "1 core", "18.0 usable GiB"]),
    # Qwen3-0.6B: 751,632,384 x 2 = 1,503,264,768 B = 1.40 GiB -> 1 core.
    ("Qwen_Qwen3-0.6B", 1, 1, 1, False, ["1.4 GiB", "1 core", "18.0 usable GiB"]),
    # Qwen3-8B: 8,190,735,360 x 2 = 16,381,470,720 B = 15.26 GiB <= 18.0 -> 1 core.
    ("Qwen_Qwen3-8B", 1, 1, 1, False, ["15.3 GiB", "1 core"]),
    # Qwen3-32B: 32,762,123,264 x 2 = 65,524,246,528 B = 61.02 GiB; /2 = 30.5 > 18, /4 = 15.3 <= 18 -> 4;
    # 64 heads % 4 = 0 and 8 kv heads % 4 = 0 -> tp=4.
    ("Qwen_Qwen3-32B", 4, 4, 1, False, ["61.0 GiB", "4 cores", "tp=4", "64 heads", "8 kv heads"]),
    # Llama-3.1-8B: 8,030,261,248 x 2 = 16,060,522,496 B = 14.96 GiB -> 1 core.
    ("meta-llama_Llama-3.1-8B-Instruct", 1, 1, 1, False, ["15.0 GiB", "1 core"]),
    # Llama-3.3-70B: 70,553,706,496 x 2 = 141,107,412,992 B = 131.42 GiB; /4 = 32.9 > 18, /8 = 16.4 -> 8;
    # 64 % 8 = 0, 8 % 8 = 0 -> tp=8.
    ("meta-llama_Llama-3.3-70B-Instruct", 8, 8, 1, False, ["131.4 GiB", "8 cores", "tp=8", "64 heads", "8 kv heads"]),
    # Mixtral-8x7B (MoE, 8 experts, but mixtral HAS a TP plan, so tensor parallelism, not expert
    # parallelism): 46,702,792,704 x 2 = 93,405,585,408 B = 86.99 GiB; /4 = 21.7 > 18, /8 = 10.9 -> 8;
    # 32 % 8 = 0, 8 % 8 = 0 -> tp=8, ep=1.
    ("mistralai_Mixtral-8x7B-Instruct-v0.1", 8, 8, 1, False, ["87.0 GiB", "8 cores", "tp=8", "32 heads"]),
    # Qwen3-30B-A3B (MoE, 128 experts, qwen3_moe has a TP plan): 30,532,122,624 x 2 = 61,064,245,248 B
    # = 56.87 GiB; /2 = 28.4 > 18, /4 = 14.2 -> 4; 32 % 4 = 0, 4 kv % 4 = 0 -> tp=4.
    ("Qwen_Qwen3-30B-A3B", 4, 4, 1, False, ["56.9 GiB", "4 cores", "tp=4", "32 heads", "4 kv heads"]),
    # gemma-3-1b-it: 999,885,952 x 2 = 1,999,771,904 B = 1.86 GiB -> 1 core.
    ("google_gemma-3-1b-it", 1, 1, 1, False, ["1.9 GiB", "1 core"]),
    # phi-4: 14,659,507,200 x 2 = 29,319,014,400 B = 27.31 GiB; /2 = 13.65 -> 2; 40 % 2 = 0, 10 kv % 2 = 0
    # -> tp=2 (4 would not divide the 10 kv heads, but memory does not ask for 4).
    ("microsoft_phi-4", 2, 2, 1, False, ["27.3 GiB", "2 cores", "tp=2", "40 heads", "10 kv heads"]),
    # DeepSeek-V3: 3,918,786,560 BF16 + 680,571,043,840 F8 + 41,555,600 F32 = 684,531,386,000 params,
    # loaded as bfloat16: x 2 = 1,369,062,772,000 B = 1275.04 GiB; /64 = 19.9 > 18, /128 = 9.96 -> needs 128
    # cores > 16 -> skip.
    ("deepseek-ai_DeepSeek-V3", 0, 1, 1, True, ["needs 128 cores", "1275.0 GiB", "--max-cores=16"]),
    # Qwen3-235B-A22B: 235,093,634,560 x 2 = 470,187,269,120 B = 437.90 GiB; /16 = 27.4 > 18, /32 = 13.7
    # -> needs 32 cores > 16 -> skip.
    ("Qwen_Qwen3-235B-A22B", 0, 1, 1, True, ["needs 32 cores", "437.9 GiB", "18.0 usable GiB", "--max-cores=16"]),
]


@pytest.mark.parametrize(
    ("name", "cores", "tp", "ep", "skipped", "numbers"), PLAN_TABLE, ids=[r[0] for r in PLAN_TABLE]
)
def test_plan_table_on_real_configs(name: str, cores: int, tp: int, ep: int, skipped: bool, numbers: list[str]) -> None:
    data = fixture(name)
    shape = real_shape(name)
    result = plan(shape)
    assert (result.cores, result.tp_size, result.ep_size, result.skip is not None) == (cores, tp, ep, skipped)
    assert result.weight_bytes == sum(data["parameters"].values()) * 2
    text = result.skip if skipped else result.reason
    assert text is not None
    for number in numbers:
        assert number in text, f"{number!r} not in {text!r}"
    if skipped:
        assert result.reason == result.skip
    assert "catalog override" not in result.reason


def test_shapes_of_real_configs() -> None:
    # gpt2 spells heads n_head; transformers' attribute map normalises it, and no GQA means kv = heads.
    gpt2 = real_shape("openai-community_gpt2")
    assert (gpt2.model_type, gpt2.num_attention_heads, gpt2.num_key_value_heads) == ("gpt2", 12, 12)
    assert (gpt2.num_experts, gpt2.has_tp_plan) == (0, False)
    assert gpt2.parameters == 137_022_720 and gpt2.weights_source == "hub api"
    mixtral = real_shape("mistralai_Mixtral-8x7B-Instruct-v0.1")  # num_local_experts
    assert (mixtral.num_experts, mixtral.has_tp_plan, mixtral.num_key_value_heads) == (8, True, 8)
    qwen_moe = real_shape("Qwen_Qwen3-30B-A3B")  # num_experts
    assert (qwen_moe.num_experts, qwen_moe.has_tp_plan) == (128, True)
    deepseek = real_shape("deepseek-ai_DeepSeek-V3")  # n_routed_experts
    assert (deepseek.num_experts, deepseek.num_attention_heads, deepseek.num_key_value_heads) == (256, 128, 128)
    gemma = real_shape("google_gemma-3-1b-it")
    assert (gemma.model_type, gemma.num_attention_heads, gemma.num_key_value_heads, gemma.has_tp_plan) == (
        "gemma3_text",
        4,
        1,
        True,
    )
    assert ModelShape.from_config({"model_type": "qwen3"}, 1).weights_source == "given"


def test_vlm_shape_comes_from_its_text_config() -> None:
    # Gemma3Config (the VLM) has no TP plan of its own; its Gemma3TextConfig does, and holds the heads.
    text = fixture("google_gemma-3-1b-it")["config"]
    shape = ModelShape.from_config({"model_type": "gemma3", "text_config": text}, 4_300_000_000)
    assert (shape.model_type, shape.num_attention_heads, shape.num_key_value_heads) == ("gemma3", 4, 1)
    assert shape.has_tp_plan
    # qwen2_5_vl with transformers' defaults: the text config's 64 heads / 8 kv heads, not the vision tower's.
    qwen_vl = ModelShape.from_config({"model_type": "qwen2_5_vl"}, 1)
    assert (qwen_vl.num_attention_heads, qwen_vl.num_key_value_heads, qwen_vl.has_tp_plan) == (64, 8, True)


def test_unknown_model_type_falls_back_to_raw_fields_without_tp_plan() -> None:
    config = {"model_type": "remote_code_arch", "n_head": 16, "num_key_value_heads": 4, "num_local_experts": 8}
    shape = ModelShape.from_config(config, 10)
    assert (shape.num_attention_heads, shape.num_key_value_heads, shape.num_experts) == (16, 4, 8)
    assert not shape.has_tp_plan
    nested = ModelShape.from_config({"model_type": "remote_vlm", "text_config": {"num_attention_heads": 8}}, 10)
    assert (nested.num_attention_heads, nested.num_key_value_heads, nested.num_experts) == (8, 8, 0)
    with pytest.raises(PlanningError, match="model_type"):
        ModelShape.from_config({"n_head": 12}, 10)


def jetmoe_shape(parameters: int, dense: int = 0) -> ModelShape:
    """An MoE without a TP plan, built honestly: jetmoe is a real MoE model_type whose transformers 5.24
    config class has no base_model_tp_plan; with transformers' defaults it has 8 experts (num_local_experts).
    The parameter counts passed in are synthetic, chosen to need a given number of cores: ``dense`` of
    them outside the experts (what every rank holds whole), the rest in the experts."""
    shape = ModelShape.from_config({"model_type": "jetmoe"}, parameters, expert_parameters=parameters - dense)
    assert (shape.has_tp_plan, shape.num_experts) == (False, 8)
    return shape


def test_expert_parallelism_keeps_the_dense_part_whole_on_every_core() -> None:
    # 15 GiB params: 12 in experts, 3 dense (x 2 B). Per core: 6 + 24 / n GiB. n=2: 18.0 <= 18 fits;
    # the old weights / n rule would have said the same here, but not below.
    two = plan(jetmoe_shape(15 * GIB, dense=3 * GIB))
    assert (two.cores, two.ep_size) == (2, 2) and "6.0 GiB dense, whole on every rank" in two.reason
    # 15 GiB params, 7 dense: 14 + 16 / n GiB. weights / n would say 2 cores (15 GiB each); really
    # 14 + 8 = 22 > 18 at 2, 14 + 4 = 18 at 4.
    four = plan(jetmoe_shape(15 * GIB, dense=7 * GIB))
    assert (four.cores, four.ep_size) == (4, 4), four.reason
    # Dense weights larger than one core: no number of expert ranks helps.
    whole = plan(jetmoe_shape(15 * GIB, dense=10 * GIB))
    assert whole.skip is not None and "20.0 GiB dense" in whole.skip, whole.skip
    # A catalog override that leaves each core over its memory is refused with the same arithmetic.
    refused = plan(jetmoe_shape(15 * GIB, dense=7 * GIB), override=2)
    assert refused.skip is not None and "does not fit memory" in refused.skip


def test_a_plan_in_words_says_cores_sharding_memory_per_core_and_why() -> None:
    # Llama-3.3-70B: 131.4 GiB of bf16 weights over tp=8: 16.4 GiB a core.
    llama = plan(real_shape("meta-llama_Llama-3.3-70B-Instruct"))
    assert llama.per_core_bytes == -(-llama.weight_bytes // 8)
    assert describe_plan(llama) == f"8 core(s), tp=8 ep=1, 16.4 GiB per core: {llama.reason}"
    # Expert parallelism: a core holds the dense part whole and its share of the experts (6 + 24 / 2 GiB).
    experts = plan(jetmoe_shape(15 * GIB, dense=3 * GIB))
    assert experts.per_core_bytes == 18 * GIB
    assert describe_plan(experts).startswith("2 core(s), tp=1 ep=2, 18.0 GiB per core: ")
    # A tiny model is not "0.0 GiB"; a skipped or uninspected one says why it does not run.
    tiny = plan(ModelShape("qwen3", 4, 2, 0, True, 100_000, "given"))
    assert describe_plan(tiny).startswith("1 core(s), tp=1 ep=1, 0.2 MiB per core: ")
    skipped = plan(real_shape("deepseek-ai_DeepSeek-V3"))
    assert describe_plan(skipped) == f"SKIPPED: {skipped.skip}" and skipped.per_core_bytes == 0
    unknown = Plan(cores=0, tp_size=1, ep_size=1, reason="x", skip=None, weight_bytes=0, error="cannot inspect")
    assert describe_plan(unknown) == "not planned: cannot inspect"
    override = Plan(cores=2, tp_size=2, ep_size=1, reason="catalog override", skip=None, weight_bytes=0)
    assert describe_plan(override) == "2 core(s), tp=2 ep=1, memory per core not known: catalog override"


def test_each_trn2_size_is_planned_with_its_own_core_limit() -> None:
    small, large = TRN2_INSTANCES
    assert (small.name, small.cores, large.name, large.cores) == ("trn2.3xlarge", 4, "trn2.48xlarge", 64)
    qwen = real_shape("Qwen_Qwen3-32B")  # 61 GiB of bf16 weights: 4 cores
    assert instance_plan(qwen, small, dtype="bfloat16").cores == 4
    llama = real_shape("meta-llama_Llama-3.3-70B-Instruct")
    assert instance_plan(llama, small, dtype="bfloat16").skip == (
        "needs 8 cores (131.4 GiB of bfloat16 weights at 18.0 usable GiB per core), more than the 4 cores of a "
        "trn2.3xlarge"
    )
    assert instance_plan(llama, large, dtype="bfloat16").cores == 8
    # The harness gives a model at most 16 cores, whatever the host has (--max-cores).
    deepseek = instance_plan(real_shape("deepseek-ai_DeepSeek-V3"), large, dtype="bfloat16")
    assert deepseek.skip is not None and deepseek.skip.endswith(
        "more than the harness's 16 cores per model (--max-cores; a trn2.48xlarge has 64)"
    )


def test_expert_parameters_are_counted_by_tensor_name_and_estimated_from_a_config() -> None:
    from pytest_neuron_support.planning.planner import estimate_expert_parameters

    assert is_expert_tensor("model.layers.3.mlp.experts.7.down_proj.weight")  # qwen3_moe, deepseek
    assert is_expert_tensor("model.layers.0.block_sparse_moe.experts.0.w1.weight")  # mixtral
    assert is_expert_tensor("model.layers.0.mlp.experts.gate_up_proj")  # gpt_oss, fused
    assert not is_expert_tensor("model.layers.3.mlp.shared_experts.down_proj.weight")  # dense
    assert not is_expert_tensor("model.layers.0.block_sparse_moe.gate.weight")  # the router
    # Qwen3-30B-A3B: 48 layers x 128 experts x 3 x 2048 x 768 = 28.99 B of its ~30.5 B parameters.
    config = fixture("Qwen_Qwen3-30B-A3B")["config"]
    assert estimate_expert_parameters(config, 128) == 48 * 128 * 3 * 2048 * 768
    assert real_shape("Qwen_Qwen3-30B-A3B").expert_parameters == 48 * 128 * 3 * 2048 * 768
    # DeepSeek-V3: the first 3 layers are dense.
    deepseek = fixture("deepseek-ai_DeepSeek-V3")["config"]
    assert estimate_expert_parameters(deepseek, 256) == (61 - 3) * 256 * 3 * 7168 * 2048
    assert estimate_expert_parameters({"num_hidden_layers": 2}, 8) == 0  # not enough to say


def test_moe_without_tp_plan_uses_expert_parallelism() -> None:
    # 15 GiB params x 2 B = 30.0 GiB; /2 = 15.0 <= 18 -> 2 cores; 8 experts % 2 = 0 -> ep=2, tp=1.
    two = plan(jetmoe_shape(15 * GIB))
    assert (two.cores, two.tp_size, two.ep_size, two.skip) == (2, 1, 2, None)
    assert "ep=2" in two.reason and "8 experts" in two.reason and "30.0 GiB" in two.reason
    # 60 GiB params x 2 = 120.0 GiB; /4 = 30 > 18, /8 = 15.0 -> 8 cores; 8 % 8 = 0 -> ep=8.
    eight = plan(jetmoe_shape(60 * GIB))
    assert (eight.cores, eight.tp_size, eight.ep_size) == (8, 1, 8)
    # 125 GiB params x 2 = 250.0 GiB; /8 = 31.25 > 18, /16 = 15.6 -> 16 cores, but 8 % 16 != 0 -> skip.
    sixteen = plan(jetmoe_shape(125 * GIB))
    assert sixteen.cores == 0 and sixteen.skip is not None
    assert "ep=16" in sixteen.skip and "8 experts" in sixteen.skip and "250.0 GiB" in sixteen.skip


def test_scaled_up_gpt2_without_tp_plan_is_skipped() -> None:
    torch = pytest.importorskip("torch")
    from transformers import GPT2Config, GPT2LMHeadModel

    # The real gpt2 config, widened and deepened; its parameters are counted on the meta device.
    config = dict(fixture("openai-community_gpt2")["config"], n_embd=4096, n_head=32, n_layer=64)
    with torch.device("meta"):
        model = GPT2LMHeadModel(GPT2Config(**config))
    parameters = sum(p.numel() for p in model.parameters())
    # 64 layers x ~12 x 4096^2 ~= 12.9e9 params -> ~24 GiB of bfloat16 > 18.0 usable GiB of one core.
    weight_gib = parameters * 2 / GIB
    assert 18 < weight_gib < 36
    result = plan(ModelShape.from_config(config, parameters))
    assert result.cores == 0 and result.skip is not None
    assert "no TP plan" in result.skip
    assert f"{weight_gib:.1f} GiB" in result.skip and "18.0 usable GiB of one core" in result.skip


def test_valid_override_wins() -> None:
    # Qwen3-8B fits 1 core (15.3 GiB); the catalog asks for 4: 32 % 4 = 0 and 8 % 4 = 0 -> tp=4.
    result = plan(real_shape("Qwen_Qwen3-8B"), override=4)
    assert (result.cores, result.tp_size, result.ep_size, result.skip) == (4, 4, 1, None)
    assert result.reason.startswith("catalog override") and "15.3 GiB" in result.reason
    one = plan(real_shape("Qwen_Qwen3-0.6B"), override=1)
    assert (one.cores, one.tp_size, one.skip) == (1, 1, None) and "catalog override" in one.reason
    # An MoE without a TP plan, overridden to 4 of its 8 experts' divisors -> ep=4.
    moe = plan(jetmoe_shape(15 * GIB), override=4)
    assert (moe.cores, moe.tp_size, moe.ep_size) == (4, 1, 4)


@pytest.mark.parametrize(
    ("name", "override", "max_cores", "needles"),
    [
        # 3 is not a core count the runtime allocates.
        ("Qwen_Qwen3-8B", 3, 16, ["cores=3", "not an allowed core count", "1, 2, 4, 8, 16"]),
        # phi-4 has 40 heads and 10 kv heads: 10 % 4 != 0.
        ("microsoft_phi-4", 4, 16, ["cores=4", "tp=4", "40 attention heads", "10 kv heads"]),
        # Llama-3.3-70B: 131.4 GiB / 4 = 32.9 GiB > 18.0 usable -> needs 8.
        ("meta-llama_Llama-3.3-70B-Instruct", 4, 16, ["cores=4", "does not fit memory", "131.4 GiB", "need 8 cores"]),
        # Qwen3-32B needs only 4, but 16 is above the session limit of 8.
        ("Qwen_Qwen3-32B", 16, 8, ["cores=16", "--max-cores=8"]),
        # gpt2 fits one core, but cannot be sharded over two: no TP plan, no experts.
        ("openai-community_gpt2", 2, 16, ["cores=2", "no TP plan"]),
    ],
)
def test_invalid_override_is_skipped_naming_the_rule(
    name: str, override: int, max_cores: int, needles: list[str]
) -> None:
    result = plan(real_shape(name), override=override, max_cores=max_cores)
    assert (result.cores, result.skip is not None) == (0, True)
    assert result.skip is not None and result.skip.startswith("catalog override")
    for needle in needles:
        assert needle in result.skip, f"{needle!r} not in {result.skip!r}"


def test_override_violating_expert_divisibility() -> None:
    result = plan(jetmoe_shape(1), override=16)
    assert result.skip is not None and "ep=16" in result.skip and "8 experts" in result.skip


def test_max_cores_below_need_is_skipped_with_the_needed_count() -> None:
    # Llama-3.3-70B needs 8 cores (see the table); a 4-core limit skips it.
    result = plan(real_shape("meta-llama_Llama-3.3-70B-Instruct"), max_cores=4)
    assert result.cores == 0 and result.skip == (
        "needs 8 cores (131.4 GiB of bfloat16 weights at 18.0 usable GiB per core), more than --max-cores=4"
    )
    # A limit that is not itself a choice still caps the candidates: 6 allows 1, 2, 4.
    assert plan(real_shape("Qwen_Qwen3-32B"), max_cores=6).cores == 4
    assert "--max-cores=6" in (plan(real_shape("meta-llama_Llama-3.3-70B-Instruct"), max_cores=6).skip or "")


def test_divisibility_failure_without_override_is_skipped() -> None:
    # phi-4 in float32: 14,659,507,200 x 4 = 58,638,028,800 B = 54.61 GiB; /2 = 27.3 > 18, /4 = 13.65 -> 4,
    # but 10 kv heads % 4 != 0 (and % 8, % 16) -> no core count works.
    result = plan(real_shape("microsoft_phi-4"), dtype="float32")
    assert result.cores == 0 and result.skip is not None
    for needle in ("54.6 GiB of float32", "need 4 cores", "tp=4", "10 kv heads", "tried 4, 8, 16"):
        assert needle in result.skip, f"{needle!r} not in {result.skip!r}"


def test_memory_boundary_and_headroom() -> None:
    qwen = real_shape("Qwen_Qwen3-8B")
    # 9 GiB params x 2 B = exactly 18 GiB = usable: fits one core; one more parameter does not.
    assert plan(dataclasses.replace(qwen, parameters=9 * GIB)).cores == 1
    assert plan(dataclasses.replace(qwen, parameters=9 * GIB + 1)).cores == 2
    # 20 GiB of weights: 2 cores at 25% headroom (18 GiB usable), 1 core with no headroom (24 GiB).
    twenty = dataclasses.replace(qwen, parameters=10 * GIB)
    assert plan(twenty).cores == 2
    assert plan(twenty, headroom=0.0).cores == 1
    # Weights are counted at the run dtype whatever they are stored in: float32 doubles bfloat16.
    assert plan(qwen, dtype="float32").weight_bytes == 2 * plan(qwen).weight_bytes


@pytest.mark.parametrize(
    "kwargs",
    [{"dtype": "int8"}, {"core_bytes": 0}, {"headroom": 1.0}, {"headroom": -0.1}, {"max_cores": 0}],
)
def test_bad_arguments_raise(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        plan(real_shape("Qwen_Qwen3-8B"), **kwargs)


# ---- safetensors headers ---------------------------------------------------------------------------


def write_safetensors(path: Path, header: dict[str, Any], data: bytes = b"") -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data)


def test_header_reader_reads_only_the_header(tmp_path: Path) -> None:
    header = {
        "__metadata__": {"format": "pt"},
        "a": {"dtype": "BF16", "shape": [3, 4], "data_offsets": [0, 24]},
        "scalar": {"dtype": "F32", "shape": [], "data_offsets": [24, 28]},
    }
    # The tensor bytes are absent: a reader that touched them would fail, this one does not need them.
    path = tmp_path / "a.safetensors"
    write_safetensors(path, header)
    assert read_safetensors_header(path)["a"]["shape"] == [3, 4]
    assert count_safetensors_parameters([path]) == 12 + 1


def test_header_reader_rejects_garbage(tmp_path: Path) -> None:
    short = tmp_path / "short.safetensors"
    short.write_bytes(b"\x01\x02")
    huge = tmp_path / "huge.safetensors"
    huge.write_bytes((1 << 40).to_bytes(8, "little") + b"{}")
    notjson = tmp_path / "bad.safetensors"
    notjson.write_bytes((4).to_bytes(8, "little") + b"nope")
    for path in (short, huge, notjson):
        with pytest.raises(PlanningError, match=path.name):
            read_safetensors_header(path)


# ---- inspect_model on real files ---------------------------------------------------------------------


def tiny_llama(directory: Path, **save: Any) -> int:
    """Save a tiny Llama with tied embeddings; return its parameter count as torch sees it."""
    pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(directory, **save)
    # parameters() yields the tied embedding once; safetensors stores it once too (no lm_head.weight).
    unique = sum(p.numel() for p in model.parameters())
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert sum(t.numel() for t in model.state_dict().values()) == unique + 128 * 32
    return unique


def test_inspect_local_checkpoint(tmp_path: Path) -> None:
    directory = tmp_path / "tiny"
    expected = tiny_llama(directory)
    shape = inspect_model(ModelSpec(id=str(directory), source="local"))
    assert shape == ModelShape(
        model_type="llama",
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts=0,
        has_tp_plan=True,
        parameters=expected,
        weights_source="local files",
    )


def test_inspect_local_sharded_checkpoint_counts_only_indexed_shards(tmp_path: Path) -> None:
    directory = tmp_path / "sharded"
    expected = tiny_llama(directory, max_shard_size="20KB")
    assert (directory / "model.safetensors.index.json").is_file()
    assert len(list(directory.glob("*.safetensors"))) > 1
    # A leftover file from an earlier save is not part of the model named by the index.
    write_safetensors(directory / "stale.safetensors", {"x": {"dtype": "F32", "shape": [1000], "data_offsets": [0, 0]}})
    assert inspect_model(ModelSpec(id=str(directory), source="local")).parameters == expected


def test_inspect_local_errors(tmp_path: Path) -> None:
    with pytest.raises(PlanningError, match=r"no config\.json"):
        inspect_model(ModelSpec(id=str(tmp_path), source="local"))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(PlanningError, match=r"no \*\.safetensors"):
        inspect_model(ModelSpec(id=str(tmp_path), source="local"))


COMMIT = "0123456789abcdef0123456789abcdef01234567"


def install_in_cache(cache: Path, repo_id: str, files: Path, skip: tuple[str, ...] = ()) -> None:
    """The Hugging Face cache layout: models--org--name/snapshots/<commit>/<file> and refs/main."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    for path in files.iterdir():
        if path.name not in skip:
            shutil.copy2(path, snapshot / path.name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)


HUB_SCRIPT = textwrap.dedent(
    """
    import dataclasses, json, sys
    from pytest_neuron_support.base.model import ModelSpec
    from pytest_neuron_support.planning.planner import PlanningError, inspect_model

    out = {}
    for key, repo, revision in json.loads(sys.argv[1]):
        try:
            out[key] = dataclasses.asdict(inspect_model(ModelSpec(id=repo, revision=revision, source="cli")))
        except PlanningError as exc:
            out[key] = {"error": str(exc)}
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def hub_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """inspect_model run in a subprocess against a private, offline hub cache.

    huggingface_hub reads HF_HUB_CACHE and HF_HUB_OFFLINE when it is imported, so the environment
    must be set before the interpreter starts.
    """
    base = tmp_path_factory.mktemp("hub")
    single, sharded = base / "single", base / "sharded"
    counts = {"single": tiny_llama(single), "sharded": tiny_llama(sharded, max_shard_size="20KB")}
    shards = sorted(p.name for p in sharded.glob("model-*.safetensors"))
    cache = base / "cache"
    install_in_cache(cache, "tiny-org/single", single)
    install_in_cache(cache, "tiny-org/sharded", sharded)
    # The index is cached but one shard is not: the cache cannot answer, and offline the API cannot either.
    install_in_cache(cache, "tiny-org/partial", sharded, skip=(shards[0],))
    cases = [
        ("single", "tiny-org/single", "main"),
        ("sharded", "tiny-org/sharded", "main"),
        ("pinned", "tiny-org/sharded", COMMIT),
        ("partial", "tiny-org/partial", "main"),
        ("missing", "tiny-org/absent", "main"),
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HOME")}
    env.update(HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, "-c", HUB_SCRIPT, json.dumps(cases)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    results: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    results["_counts"] = counts
    results["_missing_shard"] = shards[0]
    return results


def test_inspect_from_hub_cache(hub_results: dict[str, Any]) -> None:
    counts = hub_results["_counts"]
    for key, count in (("single", counts["single"]), ("sharded", counts["sharded"]), ("pinned", counts["sharded"])):
        assert hub_results[key] == {
            "model_type": "llama",
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_experts": 0,
            "has_tp_plan": True,
            "parameters": count,
            "weights_source": "hub cache",
            "expert_parameters": 0,
        }, key


def test_uncached_shard_falls_through_to_the_api(hub_results: dict[str, Any]) -> None:
    error = hub_results["partial"]["error"]
    assert "tiny-org/partial" in error
    assert f"shard {hub_results['_missing_shard']}" in error and "not cached" in error
    assert "get_safetensors_metadata" in error


def test_missing_model_offline_is_a_planning_error(hub_results: dict[str, Any]) -> None:
    error = hub_results["missing"]["error"]
    assert "tiny-org/absent" in error and "config.json" in error


def inspect_on_the_loopback_hub(record: Any, tmp_path: Path) -> tuple[dict[str, Any], list[str]]:
    """``inspect_model`` of ``record`` (a ``hubserver.ModelRecord``) through the real client against the
    loopback Hub, with nothing cached: the shape as a dict, and the paths the client asked for.
    huggingface_hub binds its endpoint at import, so the planner runs in a fresh interpreter."""
    from hubserver import HubServer

    code = (
        "import dataclasses, json, sys\n"
        "from pytest_neuron_support.base.model import ModelSpec\n"
        "from pytest_neuron_support.planning.planner import inspect_model\n"
        "print(json.dumps(dataclasses.asdict(inspect_model(ModelSpec(id=sys.argv[1])))))\n"
    )
    with HubServer([record]) as server:
        env = {**os.environ, **server.env(), "HF_HUB_CACHE": str(tmp_path / "hub")}
        env.pop("TRANSFORMERS_OFFLINE", None)
        done = subprocess.run(
            [sys.executable, "-c", code, record.id], env=env, capture_output=True, text=True, check=False
        )
        asked = [request.path for request in server.requests]
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), asked


def test_inspect_falls_back_to_the_hub_api(tmp_path: Path) -> None:
    # The real client against the loopback Hub (tests/hubserver.py): DeepSeek-V3's real config and
    # per-dtype parameter counts, served as safetensors headers the client reads with Range requests.
    from hubserver import ModelRecord

    data = fixture("deepseek-ai_DeepSeek-V3")
    dtypes = {"BF16": "BF16", "F8_E4M3": "F8_E4M3", "F32": "F32"}
    tensors = {f"w_{name.lower()}": (dtypes[name], [count]) for name, count in data["parameters"].items()}
    # One F8 tensor of them named as a routed expert's: the planner counts experts by tensor name.
    tensors["model.layers.3.mlp.experts.0.down_proj.weight"] = tensors.pop("w_f8_e4m3")
    record = ModelRecord(
        id="deepseek-ai/DeepSeek-V3", files={"config.json": json.dumps(data["config"]).encode()}, tensors=tensors
    )
    shape, asked = inspect_on_the_loopback_hub(record, tmp_path)
    assert (shape["parameters"], shape["weights_source"]) == (684_531_386_000, "hub api")
    assert shape["expert_parameters"] == data["parameters"]["F8_E4M3"]  # from the Hub's tensor names
    assert (shape["model_type"], shape["num_experts"], shape["has_tp_plan"]) == ("deepseek_v3", 256, True)
    assert any(path.endswith("/config.json") for path in asked)
    assert any("model.safetensors" in path for path in asked)  # counted from headers, weights never fetched
    rebuilt = ModelShape(**shape)
    assert plan(rebuilt).skip is not None and "needs 128 cores" in (plan(rebuilt).skip or "")


def test_mxfp4_experts_are_counted_as_the_weights_transformers_loads(tmp_path: Path) -> None:
    # gpt-oss ships its experts as MXFP4: U8 ``_blocks`` (two 4-bit weights a byte) and U8 ``_scales``,
    # which transformers dequantizes to bf16 off cuda (on neuron always). A real tiny gpt_oss checkpoint
    # in that layout, loaded by transformers, must plan as the weights it loads, by both counting paths:
    # the safetensors headers on disk and the Hub's metadata API (the loopback Hub).
    import torch
    from hubserver import ModelRecord
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, GptOssConfig, GptOssForCausalLM

    from pytest_neuron_support.planning.planner import count_safetensors_split

    config = GptOssConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    tensors: dict[str, Any] = {}
    for name, weight in GptOssForCausalLM(config).to(torch.bfloat16).state_dict().items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            experts, rows, columns = weight.shape  # stored transposed, 32 rows a block of 16 bytes
            tensors[f"{name}_blocks"] = torch.randint(0, 256, (experts, columns, rows // 32, 16), dtype=torch.uint8)
            tensors[f"{name}_scales"] = torch.full((experts, columns, rows // 32), 127, dtype=torch.uint8)
        else:
            tensors[name] = weight.contiguous()
    checkpoint = tmp_path / "gpt-oss-tiny"
    checkpoint.mkdir()
    save_file(tensors, str(checkpoint / "model.safetensors"), metadata={"format": "pt"})
    raw_config = {**config.to_dict(), "quantization_config": {"quant_method": "mxfp4"}}
    (checkpoint / "config.json").write_text(json.dumps(raw_config), encoding="utf-8")

    loaded = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16)
    weights = sum(p.numel() for p in loaded.parameters())
    expert_weights = sum(p.numel() for name, p in loaded.named_parameters() if is_expert_tensor(name))
    assert loaded.model.layers[0].mlp.experts.down_proj.dtype == torch.bfloat16  # dequantized, not packed
    elements = sum(t.numel() for t in tensors.values())
    assert elements < weights  # the header's element count is not the weights the device holds

    assert count_safetensors_split([checkpoint / "model.safetensors"]) == (weights, expert_weights)

    header = read_safetensors_header(checkpoint / "model.safetensors")
    record = ModelRecord(
        id="openai/gpt-oss-tiny",
        files={"config.json": json.dumps(raw_config).encode()},
        tensors={name: (info["dtype"], info["shape"]) for name, info in header.items() if name != "__metadata__"},
    )
    shape = inspect_on_the_loopback_hub(record, tmp_path)[0]
    assert (shape["parameters"], shape["expert_parameters"], shape["weights_source"]) == (
        weights,
        expert_weights,
        "hub api",
    )


def test_module_import_stays_cheap() -> None:
    code = (
        "import sys, pytest_neuron_support.planning.planner; "
        "print([m for m in ('torch', 'transformers', 'huggingface_hub') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO).stdout
    assert out.strip() == "[]"


def test_local_safetensors_headers_split_expert_tensors_by_name(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    from pytest_neuron_support.planning.planner import count_safetensors_split

    save_file(
        {
            "model.embed_tokens.weight": torch.zeros(10, 4),
            "model.layers.0.mlp.experts.0.up_proj.weight": torch.zeros(6, 4),
            "model.layers.0.mlp.experts.1.up_proj.weight": torch.zeros(6, 4),
            "model.layers.0.mlp.shared_experts.up_proj.weight": torch.zeros(3, 4),
        },
        str(tmp_path / "model.safetensors"),
    )
    assert count_safetensors_split([tmp_path / "model.safetensors"]) == (40 + 24 + 24 + 12, 48)


@pytest.mark.parametrize(
    ("cpus", "workers", "threads"),
    [
        (2, 1, 1),  # one item: its device run and its reference, one CPU each
        (2, 2, 1),  # never fewer than one
        (8, 1, 4),
        (8, 0, 4),  # xdist off (-n 0) is one worker
        (192, 16, 6),  # a trn2.48xlarge's vCPUs, -n 16
        (7, 2, 1),
    ],
)
def test_cpu_threads_share_the_cpus_among_the_workers_concurrent_runs(cpus: int, workers: int, threads: int) -> None:
    assert cpu_threads(cpus, workers) == threads


def test_config_facts_are_read_once_and_a_later_process_plans_from_them_without_transformers(tmp_path: Path) -> None:
    cache = tmp_path / "facts"
    config = fixture("google_gemma-3-1b-it")["config"]
    first = ModelShape.from_config(config, 1_000_000, cache=cache)
    assert [p.suffix for p in cache.iterdir()] == [".json"]  # one entry, written atomically (no temporary left)
    assert first == ModelShape.from_config(config, 1_000_000)  # what reading without a cache gives
    # A fresh process with the same config and cache: the same shape, and transformers never imported.
    code = textwrap.dedent(
        f"""
        import dataclasses, json, sys
        from pathlib import Path
        from pytest_neuron_support.planning.planner import ModelShape
        config = json.loads({json.dumps(json.dumps(config))})
        shape = ModelShape.from_config(config, 1_000_000, cache=Path({str(cache)!r}))
        print(json.dumps([dataclasses.asdict(shape), "transformers" in sys.modules, "torch" in sys.modules]))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO).stdout
    assert json.loads(out) == [dataclasses.asdict(first), False, False]


def test_config_facts_entries_follow_the_config_and_a_bad_entry_is_read_afresh(tmp_path: Path) -> None:
    from pytest_neuron_support.planning.planner import config_facts

    cache = tmp_path / "facts"
    config = {"model_type": "llama", "num_attention_heads": 8}
    facts = config_facts(config, cache)
    assert (facts.known, facts.heads, facts.kv_heads, facts.has_tp_plan) == (True, 8, 8, True)
    gqa = config_facts({**config, "num_key_value_heads": 2}, cache)  # another config: another entry
    assert (gqa.heads, gqa.kv_heads) == (8, 2) and len(list(cache.iterdir())) == 2
    (entry,) = [e for e in cache.iterdir() if json.loads(e.read_text())["kv_heads"] == 8]
    for bad in ("{not json", json.dumps({"heads": 8}), json.dumps({**dataclasses.asdict(facts), "heads": "8"})):
        entry.write_text(bad)
        assert config_facts(config, cache) == facts  # an entry of the wrong shape or types is no hit
        assert json.loads(entry.read_text()) == dataclasses.asdict(facts)  # and it was replaced


def test_config_facts_folder_follows_the_environment(tmp_path: Path) -> None:
    from pytest_neuron_support.planning.planner import config_cache_dir

    assert config_cache_dir({"NEURON_SUPPORT_CONFIG_CACHE": str(tmp_path)}) == tmp_path
    assert config_cache_dir({"NEURON_SUPPORT_CONFIG_CACHE": "none"}) is None
    assert config_cache_dir({"NEURON_SUPPORT_CACHE": str(tmp_path)}) == tmp_path / "config-facts"
    assert config_cache_dir({}) == Path("~/.cache/neuron-support/config-facts").expanduser()
