"""The compile-readiness census (``benchmarks/census.py``) on CI's fixed sample (five text-generation
architectures, T5's encoder-decoder and one of each forward task family: text, vision, audio): built offline,
swept by the plugin through the same run.py on CPU, written as a dataset of ``source: census`` rows that pandas
reads back, tabulated per task in ``census.md``, and continued by ``--resume`` without running anything twice.
The whole census is a benchmark run (benchmarks/README.md); its table is in docs/census.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "census.py"


def census(results: Path, cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # The script sets the sweep's Hub cache and offline mode itself; nothing of this session's reaches it.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "HF_HUB_CACHE")}
    return subprocess.run(
        [sys.executable, str(SCRIPT), f"--results-dir={results}", f"--cache-dir={cache}", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )


@pytest.mark.slow
def test_the_census_sample_sweeps_every_task_family_into_census_rows_and_resume_runs_none_again(
    tmp_path: Path,
) -> None:
    results, cache = tmp_path / "census", tmp_path / "hub"
    done = census(results, cache, "--sample")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    sample = ["gemma3_text", "gpt2", "llama", "mamba", "qwen3_moe"]
    for arch in sample:
        assert f"[census] {arch}: built (" in done.stdout
    # The plugin's own progress lines: the census is a sweep like any other.
    assert "[neuron-support] start census/llama: 1 core(s)" in done.stdout
    forward = {
        "census-text2text-generation/t5": "text2text-generation",
        "census-text-classification/bert": "text-classification",
        "census-image-classification/vit": "image-classification",
        "census-automatic-speech-recognition-ctc/wav2vec2": "automatic-speech-recognition-ctc",
    }
    for repo, task in forward.items():
        assert f"[census] {repo.split('/')[1]} ({task}): built (" in done.stdout
    every = pd.read_parquet(results / "data").set_index("model_id")
    assert sorted(every.index) == sorted([f"census/{a}" for a in sample] + list(forward))
    assert set(every.source) == {"census"} and set(every.device) == {"cpu"}
    # Each other task's architecture ran its own row's run.py in one graph: T5 its compiled decoding step, judged
    # by parity and the teacher-forced check; the forward tasks their compiled forward pass, judged by the
    # calibrated comparison with the CPU's.
    swept = every.loc[list(forward)]
    assert swept.task.to_dict() == forward and set(swept.result) == {"PASS"}
    assert swept.verdict_basis.to_list() == ["parity+teacher-forced"] + 3 * ["forward-calibrated"]
    assert (swept.graphs_compiled == 1).all() and (swept.graph_breaks == 0).all()
    assert swept.positions_disagreeing.iloc[0] == 0 and swept.positions_checked.iloc[0] > 0
    rows = every[every.task == "text-generation"]
    # Compiled static-cache generate() with the teacher-forced CPU check over its tokens, every one.
    assert (rows.positions_checked > 0).all() and (rows.positions_disagreeing == 0).all()
    # Gemma 3's sliding-window cache recompiles every decoding step until Dynamo gives up (transformers
    # #44609; the tiny zoo's gemma3_text expects it too); the other four trace into one decoding graph.
    assert rows.loc["census/gemma3_text", "recompile_limit"]
    one_graph = rows[(rows.graphs_compiled == 1) & (rows.graph_breaks == 0) & rows.recompile_limit.isna()]
    assert sorted(one_graph.index) == ["census/gpt2", "census/llama", "census/mamba", "census/qwen3_moe"]
    table = (results / "census.md").read_text()
    assert "**4 compile to exactly one decoding graph**" in table and "1 hit Dynamo's recompile limit" in table
    assert "| llama | PASS | 1 | 0 |" in table and "| gemma3_text | PASS |" in table
    # The count per task, then each task's own table.
    assert "9 architectures of 5 tasks; 9 built as tiny random models, 9 swept" in table
    assert "| text-generation | 5 | 5 | 5 | 4 | 0 | 1 | 5 | 0 | 0 |" in table
    assert "| image-classification | 1 | 1 | 1 | 1 | 0 | 0 | 1 | 0 | 0 |" in table
    assert (
        "## automatic-speech-recognition-ctc" in table
        and "| wav2vec2 | PASS | 1 | 0 | 0 |  | forward-calibrated |" in table
    )
    builds = json.loads((results / "builds.json").read_text())
    assert [b["model_type"] for b in builds] == [*sample, "t5", "bert", "vit", "wav2vec2"]
    assert [b["task"] for b in builds][-4:] == list(forward.values()) and all(b["repo_id"] for b in builds)
    assert "## text2text-generation" in table and "| t5 | PASS | 1 | 0 | 0 |  | agrees (" in table

    # --resume continues a census: the built models are reused and no architecture runs again.
    again = census(results, cache, "--sample", "--resume")
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-4000:]
    assert "9 skipped" in again.stdout
    assert len(pd.read_parquet(results / "data")) == 9


def test_a_sample_of_a_task_it_does_not_have_or_an_empty_only_is_refused_before_anything_runs(tmp_path: Path) -> None:
    results, cache = tmp_path / "census", tmp_path / "hub"
    refused = census(results, cache, "--sample", "--task", "fill-mask")
    assert refused.returncode == 2 and not results.exists() and not cache.exists()
    assert "--sample --task fill-mask: CI's sample has no architecture of it" in refused.stderr
    assert "use --only with --task instead" in refused.stderr
    empty = census(results, cache, "--only", ",")
    assert empty.returncode == 2 and "--only: no model_type given" in empty.stderr and not results.exists()
