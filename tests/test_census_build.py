"""The census: tiny random models built offline from transformers' default configs, installed in a Hub cache
as ``census/<model_type>`` (causal LMs) and ``census-<task>/<model_type>`` (every forward task's architectures,
each with its own preprocessor).

Real builds, no mocks, of a few architectures only (a dense one, gpt2's renamed fields, a MoE; a masked LM, an
image classifier, an audio classifier); the whole census (about 650 architectures) is for a person to run, not
for the suite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_neuron_support.zoo import census
from pytest_neuron_support.zoo.census import CENSUS_ORG, CensusBuild, census_architectures
from pytest_neuron_support.zoo.hubcache import _snapshot_path, installed

REPO = Path(__file__).resolve().parent.parent
BUILT = ("llama", "gpt2", "qwen3_moe")
UNKNOWN = "not_a_model_type"
MAX_PARAMETERS = 5_000_000


def in_fresh_process(setup: str, call: str) -> tuple[list[CensusBuild], list[CensusBuild]]:
    """``build_census`` called in a Python process of its own (``setup`` first, e.g. a lowered limit),
    its results and what its progress callback saw read back. A build imports the modeling code of
    every architecture it builds and keeps its models until it returns: in a process of its own, none
    of that stays in the worker that runs the next tests. (The worker crashes first blamed on in-process
    builds were torch imported twice, tests/librarykeeper.py.)"""
    code = (
        "import dataclasses, json\n"
        "from pytest_neuron_support.zoo import census\n"
        "from pytest_neuron_support.zoo.census import build_census\n"
        f"{setup}\n"
        "seen = []\n"
        f"results = {call}\n"
        "print(json.dumps([[dataclasses.asdict(r) for r in results], [dataclasses.asdict(r) for r in seen]]))\n"
    )
    results, seen = python_json(code, HF_HUB_OFFLINE="1")
    return [CensusBuild(**r) for r in results], [CensusBuild(**r) for r in seen]


def python_json(code: str, **env: str) -> Any:
    """What ``code`` prints as JSON on its last line, run by a fresh Python in this repository with only
    ``env`` of the Hugging Face variables (and the rest of this environment)."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=_clean_env(**env),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[CensusBuild], list[CensusBuild]]:
    """One census build (module-wide: the tokenizer alone takes seconds): the cache, the results and
    what the progress callback saw."""
    cache = tmp_path_factory.mktemp("census") / "hub"
    results, seen = in_fresh_process("", f"build_census({str(cache)!r}, {[*BUILT, UNKNOWN]!r}, progress=seen.append)")
    return cache, results, seen


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE", "TRANSFORMERS_"))}
    env.update(extra)
    return env


def test_architectures_are_the_causal_lm_mapping() -> None:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    archs = census_architectures()
    assert archs == tuple(sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES))
    assert set(BUILT) <= set(archs)
    assert UNKNOWN not in archs


def test_one_result_per_model_type_in_order(built: tuple[Path, list[CensusBuild], list[CensusBuild]]) -> None:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    cache, results, seen = built
    assert [r.model_type for r in results] == [*BUILT, UNKNOWN]
    assert seen == results
    for r in results[: len(BUILT)]:
        assert r.step is None and r.error is None, r
        assert r.repo_id == f"{CENSUS_ORG}/{r.model_type}"
        assert r.model_class == MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[r.model_type]
        assert r.parameters is not None and 0 < r.parameters < MAX_PARAMETERS
        assert installed(cache, r.repo_id)


def test_unknown_model_type_is_reported_not_raised(
    built: tuple[Path, list[CensusBuild], list[CensusBuild]],
) -> None:
    cache, results, _ = built
    unknown = results[-1]
    assert unknown == CensusBuild(UNKNOWN, None, "", None, "config", unknown.error)
    assert unknown.error is not None and unknown.error.startswith("KeyError: ") and UNKNOWN in unknown.error
    assert not installed(cache, f"{CENSUS_ORG}/{UNKNOWN}")


def test_built_models_load_and_generate_offline(built: tuple[Path, list[CensusBuild], list[CensusBuild]]) -> None:
    """In a fresh process with only HF_HUB_CACHE and HF_HUB_OFFLINE=1, as a user loads them: by repo id,
    model and tokenizer, and greedy generation runs."""
    cache, results, _ = built
    code = f"""
import json, torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers")
FIELDS += ("num_experts", "num_experts_per_tok", "moe_intermediate_size")
out = {{}}
for mt in {list(BUILT)!r}:
    repo = "{CENSUS_ORG}/" + mt
    tok = AutoTokenizer.from_pretrained(repo)
    model = AutoModelForCausalLM.from_pretrained(repo)
    enc = tok("the quick brown fox", return_tensors="pt")
    with torch.no_grad():
        ids = model.generate(**enc, max_new_tokens=6, min_new_tokens=6)
    out[mt] = {{
        "class": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "new_tokens": ids[0, enc["input_ids"].shape[1]:].tolist(),
        "text": tok.decode(ids[0]),
        "vocab": len(tok),
        "config": {{k: getattr(model.config, k, None) for k in FIELDS}},
        "do_sample": GenerationConfig.from_pretrained(repo).do_sample,
    }}
print(json.dumps(out))
"""
    env = _clean_env(HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600, cwd=REPO, check=False
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    by_type = {r.model_type: r for r in results}
    for mt in BUILT:
        got = out[mt]
        assert got["class"] == by_type[mt].model_class
        assert got["parameters"] == by_type[mt].parameters
        assert len(got["new_tokens"]) == 6 and all(0 <= t < got["vocab"] for t in got["new_tokens"])
        assert got["text"].startswith("the quick brown fox")
        assert got["do_sample"] is False
        cfg = got["config"]
        assert cfg["vocab_size"] == got["vocab"]
        assert (cfg["hidden_size"], cfg["num_hidden_layers"]) == (64, 2)  # gpt2's n_embd and n_layer too
    moe = out["qwen3_moe"]["config"]
    assert (moe["num_experts"], moe["num_experts_per_tok"], moe["moe_intermediate_size"]) == (4, 2, 32)


def test_model_card_says_what_it_is(built: tuple[Path, list[CensusBuild], list[CensusBuild]]) -> None:
    import transformers

    cache, _, _ = built
    snapshot = _snapshot_path(cache, f"{CENSUS_ORG}/llama")
    assert snapshot is not None
    card = (snapshot / "README.md").read_text()
    assert "Random weights" in card
    assert f"transformers {transformers.__version__}'s default `LlamaConfig`" in card
    assert "LlamaForCausalLM" in card
    files = {p.name for p in snapshot.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json"} <= files


def test_second_call_reuses_installed_models(built: tuple[Path, list[CensusBuild], list[CensusBuild]]) -> None:
    """Installed with the current fingerprint: nothing is rebuilt (not even the tokenizer), the
    snapshots stay as they are, and the results are the same."""
    cache, results, _ = built
    before = {}
    for mt in BUILT:
        snapshot = _snapshot_path(cache, f"{CENSUS_ORG}/{mt}")
        assert snapshot is not None
        before[mt] = (snapshot, (snapshot / "model.safetensors").resolve().stat().st_mtime_ns)
    refuse = (
        "def no_build(out_dir):\n"
        "    raise AssertionError('the tokenizer was built again: something was rebuilt')\n"
        "census._build_tokenizer = no_build"
    )
    again, _ = in_fresh_process(refuse, f"build_census({str(cache)!r}, {[*BUILT, UNKNOWN]!r})")
    assert again == results
    for mt, (snapshot, mtime) in before.items():
        assert _snapshot_path(cache, f"{CENSUS_ORG}/{mt}") == snapshot
        assert (snapshot / "model.safetensors").resolve().stat().st_mtime_ns == mtime


def test_too_large_after_shrinking_is_reported(tmp_path: Path) -> None:
    """An architecture the rules leave above the size limit fails at the model step, with its count,
    and nothing is installed (the limit is lowered here; every real architecture is far below it)."""
    (result,), _ = in_fresh_process("census._MAX_PARAMETERS = 1000", f"build_census({str(tmp_path)!r}, ['gpt2'])")
    assert result.step == "model" and result.repo_id is None
    assert result.parameters is not None and result.parameters > 1000
    assert result.error == f"too large after shrinking: {result.parameters} params"
    assert not installed(tmp_path, f"{CENSUS_ORG}/gpt2")


@pytest.mark.parametrize(
    ("model_type", "kinds"),
    [
        # one layer of each kind survives the cut to a tiny depth
        ("gemma3_text", ["sliding_attention", "full_attention"]),
        ("qwen3_next", ["linear_attention", "full_attention"]),
    ],
)
def test_shrinking_keeps_each_layer_kind(model_type: str, kinds: list[str]) -> None:
    config = census._shrunk_config(model_type, 768, {"<s>": 2, "</s>": 1, "<pad>": 0})
    assert config.layer_types == kinds
    assert config.num_hidden_layers == len(kinds)
    assert (config.hidden_size, config.num_attention_heads, config.vocab_size) == (64, 4, 768)


# --- every task with a row ------------------------------------------------------------------------


def test_the_census_has_text_generation_and_every_forward_task_with_a_registry_of_its_own() -> None:
    import importlib

    from pytest_neuron_support.tasks.forward import ForwardTask
    from pytest_neuron_support.tasks.table import TASKS

    tasks = census.census_tasks()
    forward = [t for t in TASKS.values() if isinstance(t, ForwardTask) and t.registry is not None]
    assert list(tasks) == ["text-generation", "text2text-generation", *(t.name for t in forward)]
    seq2seq = TASKS["text2text-generation"].registry
    assert seq2seq is not None and tasks["text2text-generation"].registry == seq2seq[1]
    assert census_architectures("text2text-generation") == tuple(
        sorted(getattr(importlib.import_module(seq2seq[0]), seq2seq[1]))
    )
    for task in forward:
        mapping = getattr(importlib.import_module(task.registry[0]), task.registry[1])
        assert census_architectures(task.name) == tuple(sorted(mapping)), task.name
        assert tasks[task.name].auto_class == task.auto_class
    # A task the census does not build is refused by name, with the ones it has.
    with pytest.raises(ValueError, match=r"the census has no task 'text-to-image': one of text-generation, "):
        census_architectures("text-to-image")


def test_a_forward_task_shrinks_without_the_causal_switch_and_with_its_backbone_built_offline() -> None:
    ids = {"<s>": 2, "</s>": 1, "<pad>": 0}
    # A causal LM of an encoder family is made causal; the same architecture's masked LM is not.
    assert census._shrunk_config("bert", 768, ids).is_decoder is True
    assert census._shrunk_config("bert", 768, ids, shrinking=census._FORWARD).is_decoder is False
    # DETR's default backbone is timm's ResNet-50 (timm is not installed): transformers' own ResNet instead, shrunk.
    assert census._shrunk_config("detr", 768, ids).backbone_config.model_type == "timm_backbone"
    detr = census._shrunk_config("detr", 768, ids, shrinking=census._FORWARD)
    assert detr.backbone_config.model_type == "resnet" and detr.backbone_config.hidden_sizes == [32, 32, 32, 32]
    # A hierarchical backbone: every stage small and one block deep, at the vision tasks' image size.
    convnext = census._shrunk_config("convnext", 768, ids, shrinking=census._FORWARD)
    assert convnext.depths == [1, 1, 1, 1] and convnext.hidden_sizes == [32, 32, 32, 32]
    assert census._shrunk_config("vit", 768, ids, shrinking=census._FORWARD).image_size == 64
    # An encoder-decoder's decoder starts at the zoo tokenizer's pad (BART's default start is its eos, id 2).
    assert census._shrunk_config("bart", 768, ids, shrinking=census._SEQ2SEQ).decoder_start_token_id == 0
    assert census._shrunk_config("bart", 768, ids).decoder_start_token_id == 2


FORWARD = {
    "fill-mask": ["bert"],
    "image-classification": ["vit", "dinov2_with_registers", UNKNOWN],
    "audio-classification": ["wav2vec2"],
}


@pytest.fixture(scope="module")
def forward_built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[CensusBuild]]]:
    cache = tmp_path_factory.mktemp("census-forward") / "hub"
    built: dict[str, list[CensusBuild]] = {}
    for task, types in FORWARD.items():
        built[task], _ = in_fresh_process("", f"build_census({str(cache)!r}, {types!r}, task={task!r})")
    return cache, built


def test_forward_task_models_are_built_each_under_its_task(
    forward_built: tuple[Path, dict[str, list[CensusBuild]]],
) -> None:
    cache, built = forward_built
    bert, vit, registers, unknown = built["fill-mask"][0], *built["image-classification"]
    assert (bert.repo_id, bert.task, bert.model_class) == ("census-fill-mask/bert", "fill-mask", "BertForMaskedLM")
    assert vit.repo_id == "census-image-classification/vit" and vit.step is None
    assert built["audio-classification"][0].repo_id == "census-audio-classification/wav2vec2"
    # What cannot be built is reported with its step and why, and nothing of it is installed.
    assert (registers.repo_id, registers.step) == (None, "preprocessor")
    assert registers.error == "ValueError: transformers maps no image preprocessor to 'dinov2_with_registers'"
    assert not installed(cache, "census-image-classification/dinov2_with_registers")
    assert (unknown.step, unknown.task) == ("config", "image-classification")
    assert unknown.error == f"KeyError: {UNKNOWN!r} is not a model_type of MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"
    snapshot = _snapshot_path(cache, "census-image-classification/vit")
    assert snapshot is not None
    card = (snapshot / "README.md").read_text()
    assert "pipeline_tag: image-classification\n" in card and "census_task: image-classification\n" in card
    assert json.loads((snapshot / "preprocessor_config.json").read_text())["size"] == {"height": 64, "width": 64}


def test_forward_task_models_load_offline_and_run_what_run_py_feeds_them(
    forward_built: tuple[Path, dict[str, list[CensusBuild]]],
) -> None:
    """In a fresh process with only HF_HUB_CACHE and HF_HUB_OFFLINE=1, each model and its preprocessor load by
    repo id with the row's own classes, and run.py's own inputs (its template's ``forward_batch``) run through."""
    cache, _ = forward_built
    code = """
import json, torch, transformers
from pytest_neuron_support.tasks.table import task_of
from pytest_neuron_support.zoo.forward import _run_batch
out = {}
for repo, name in [("census-fill-mask/bert", "fill-mask"), ("census-image-classification/vit", "image-classification"),
                   ("census-audio-classification/wav2vec2", "audio-classification")]:
    task = task_of(name)
    model = getattr(transformers, task.auto_class).from_pretrained(repo).eval()
    preprocessor = getattr(transformers, task.reading.preprocessor or "AutoTokenizer").from_pretrained(repo)
    batch, _ = _run_batch(torch, task, preprocessor)
    with torch.no_grad():
        output = getattr(model(**batch), task.reading.output)
    out[name] = [list(output.shape), bool(torch.isfinite(output).all())]
print(json.dumps(out))
"""
    out = python_json(code, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache))
    from pytest_neuron_support.tasks.forward import LENGTH, MASKED_SENTENCES

    # Four masked sentences padded to the row's length, over the zoo tokenizer and its mask token; the test card
    # and its mirror image over ViT's two default labels; the waveform and its reverse likewise.
    assert out["fill-mask"][0][:2] == [len(MASKED_SENTENCES), LENGTH] and out["fill-mask"][1]
    assert out["image-classification"] == [[2, 2], True]
    assert out["audio-classification"] == [[2, 2], True]
