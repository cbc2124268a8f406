"""Tasks beyond text generation, through the plugin as users run it: a vision-language model of the
tiny zoo, and a real trained sentence-embedding model (all-MiniLM-L6-v2 from its PyPI package)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from faultkit import assert_outcomes

from pytest_neuron_support import zoo
from pytest_neuron_support.base.storage import slug
from pytest_neuron_support.catalog.load import parse_catalog
from pytest_neuron_support.devices.table import DEVICES
from pytest_neuron_support.run.runscript import RunSpec, render, template
from pytest_neuron_support.tasks.embedding import EMBEDDING_SENTENCES
from pytest_neuron_support.tasks.table import task_of
from pytest_neuron_support.verdict.embeddings import DEFAULT_MIN_COSINE, compare_embeddings
from pytest_neuron_support.verdict.tolerance import FLOOR, MULTIPLE

MINILM = zoo.MINILM_REPO
#: The same checkpoint under another id, so one session can run it clean and perturbed.
PERTURBED = "perturbed/all-MiniLM-L6-v2"

# Test-only perturbation of the device run (the CPU reference stays clean): Gaussian noise on every
# weight, a few percent of a typical weight, seeded so the run is reproducible.
PERTURB = f"""
def pytest_neuron_support_post_load(config, model):
    if model.id == {PERTURBED!r}:
        return (
            "torch.manual_seed(1)\\n"
            "with torch.no_grad():\\n"
            "    for parameter in model.parameters():\\n"
            "        parameter.add_(torch.randn_like(parameter) * 0.02)\\n"
        )
    return None
"""


@pytest.fixture
def minilm_hub(offline_hub: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private copy of the zoo cache holding all-MiniLM-L6-v2 under its own id and a second id."""
    cache = tmp_path / "hub"
    shutil.copytree(offline_hub, cache, symlinks=True)
    snapshot = zoo.install_minilm(cache)
    if snapshot is None:
        pytest.fail(f"{zoo.MINILM_PACKAGE} is not installed: pip install -e '.[test]' installs it")
    zoo.install_snapshot(cache, PERTURBED, snapshot)  # the same files (symlinks are followed)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


@pytest.mark.usefixtures("eager_compile")
@pytest.mark.slow
def test_vlm_and_real_minilm_pass_and_a_perturbed_minilm_fails_at_parity(
    pytester: pytest.Pytester, minilm_hub: Path
) -> None:
    pytester.makeconftest(PERTURB)
    pytester.makefile(
        ".yaml",
        models=(
            "models:\n"
            f"  - id: tiny-random/llava\n    task: image-text-to-text\n    prompt: {json.dumps(zoo.TINY_PROMPT)}\n"
            f"  - id: {MINILM}\n    task: sentence-similarity\n    dtype: float32\n"
            f"  - id: {PERTURBED}\n    task: sentence-similarity\n    dtype: float32\n"
        ),
    )
    result = pytester.runpytest_subprocess(
        "--device=cpu", "-n", "2", "--results-dir=out", "--reference-cache=none", "--model-timeout=900"
    )
    assert_outcomes(result, pytester.path / "out", passed=2, failed=1)
    df = pd.read_parquet(pytester.path / "out" / "data").set_index("model_id")

    vlm = df.loc["tiny-random/llava"]
    assert (vlm.result, vlm.task) == ("PASS", "image-text-to-text")
    assert len(vlm.tokens) == 32 and vlm.matched_prefix == 32 and vlm.graphs_compiled >= 1
    assert vlm.text.startswith(" the quick brown fox jumps over a lazy dog.")
    assert "AutoModelForImageTextToText" in vlm.runscript and "def fixed_image(" in vlm.runscript
    assert vlm.min_cosine is None or math.isnan(vlm.min_cosine)

    minilm = df.loc[MINILM]
    assert (minilm.result, minilm.task, minilm["dtype"]) == ("PASS", "sentence-similarity", "float32")
    assert DEFAULT_MIN_COSINE <= minilm.min_cosine <= 1.0 and minilm.reference_match
    assert minilm.cosine_threshold == DEFAULT_MIN_COSINE
    # The calibrated rule judged every sentence: float32 on the device, so the floor is the rule's own.
    assert minilm.verdict_basis == "embedding-calibrated" and minilm.reference_dtype == "float32"
    assert len(minilm.numeric_stages) == len(EMBEDDING_SENTENCES) and minilm.noise_ratio <= MULTIPLE
    assert minilm.noise_floor == FLOOR and minilm.evidence_stage == "embedding"
    assert minilm.graphs_compiled >= 1 and minilm.compile_s > 0 and len(minilm.tokens) == 0
    assert pd.isna(minilm.prompt) and pd.isna(minilm.failure_stage) and pd.isna(minilm.max_new_tokens)

    perturbed = df.loc[PERTURBED]
    assert (perturbed.result, perturbed.failure_stage) == ("FAIL", "parity")
    assert perturbed.min_cosine < DEFAULT_MIN_COSINE and not perturbed.reference_match
    assert perturbed.verdict_basis == "embedding-calibrated" and perturbed.noise_ratio > MULTIPLE
    assert "embeddings: embedding at step 0: relative distance from float32" in perturbed.error
    assert "parameter.add_(torch.randn_like(parameter) * 0.02)" in perturbed.runscript

    # run.py reproduces the checkpoint's own pooling: its CPU embeddings are sentence-transformers'.
    # (In a subprocess: torch imported inside a pytester test would be dropped from sys.modules.)
    runs = pytester.path / "out" / "runs" / slug(MINILM) / "cpu"
    reference = json.loads((runs / "reference" / "result.json").read_text())
    assert reference["pooling"]["modes"] == ["mean"] and reference["pooling"]["normalize"] is True
    snapshot = zoo.install_minilm(minilm_hub)
    encode = (
        "import json, sys; from sentence_transformers import SentenceTransformer; "
        f"model = SentenceTransformer({str(snapshot)!r}, device='cpu'); "
        f"print(json.dumps(model.encode({list(EMBEDDING_SENTENCES)!r}).tolist()))"
    )
    proc = subprocess.run([sys.executable, "-c", encode], capture_output=True, text=True, timeout=300, check=True)
    encoded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert compare_embeddings(reference["embeddings"], encoded, 1 - 1e-6).match


def test_embedding_entries_take_a_threshold_and_no_prompt() -> None:
    catalog = parse_catalog(
        "models:\n"
        "  - {id: org/emb, task: feature-extraction, min_cosine: 0.99}\n"
        "  - {id: org/sim, task: sentence-similarity}\n",
        "tasks.yaml",
    )
    emb, sim = catalog.models
    assert task_of(emb.task).cosine and emb.min_cosine == 0.99
    assert task_of(sim.task).cosine and sim.min_cosine is None


def test_embedding_run_script_writes_the_sentences_and_compiles_the_forward() -> None:
    spec = RunSpec(
        model=MINILM,
        revision="main",
        task="sentence-similarity",
        dtype="float32",
        prompt="",
        max_new_tokens=32,
        device=DEVICES["cpu"],
        compile=True,
        compile_backend="inductor",
        sentences=EMBEDDING_SENTENCES,
        **task_of("sentence-similarity").script_fields(),
    )
    source = render(spec)
    namespace: dict[str, object] = {"__name__": "run_py"}
    exec(compile(source, "run.py", "exec"), namespace)
    written = namespace["SPEC"]
    assert isinstance(written, dict) and written["sentences"] == list(EMBEDDING_SENTENCES)
    assert written["task"] == "sentence-similarity" and written["compile"] is True
    assert 'torch.compile(model, backend=SPEC["compile_backend"]' in source


def test_the_test_card_is_deterministic_and_not_flat() -> None:
    import torch

    namespace: dict[str, object] = {"__name__": "run_template"}
    exec(compile(template("run.py", task_of("image-text-to-text").fragments), "run.py", "exec"), namespace)
    draw = namespace["fixed_image"]
    assert callable(draw)
    card = draw(torch, 224, 224)
    assert card.shape == (3, 224, 224) and card.dtype == torch.uint8
    assert torch.equal(card, draw(torch, 224, 224))
    # A gradient with shapes on it: many distinct colours, dark and bright regions.
    assert len(torch.unique(card.reshape(3, -1), dim=1).T) > 1000
    assert int(card.min()) <= 16 and int(card.max()) == 255
    # Pinned pixel sums: a change to the drawing changes every image-text-to-text reference.
    assert [int(c.sum()) for c in card.to(torch.int64)] == CARD_SUMS


CARD_SUMS = [6653299, 6653299, 5799294]
