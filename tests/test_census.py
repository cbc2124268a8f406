"""The compile-readiness census (``benchmarks/census.py``) on CI's fixed sample of five architectures: built
offline, swept by the plugin through the same run.py on CPU, written as a dataset of ``source: census`` rows
that pandas reads back, tabulated in ``census.md``, and continued by ``--resume`` without running anything
twice. The whole census is a benchmark run (benchmarks/README.md); its table is in docs/census.md."""

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
def test_the_census_sample_sweeps_five_architectures_into_census_rows_and_resume_runs_none_again(
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
    rows = pd.read_parquet(results / "data").set_index("model_id")
    assert sorted(rows.index) == [f"census/{a}" for a in sample]
    assert set(rows.source) == {"census"} and set(rows.device) == {"cpu"}
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
    builds = json.loads((results / "builds.json").read_text())
    assert [b["model_type"] for b in builds] == sample and all(b["repo_id"] for b in builds)

    # --resume continues a census: the built models are reused and no architecture runs again.
    again = census(results, cache, "--sample", "--resume")
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-4000:]
    assert "5 skipped" in again.stdout
    assert len(pd.read_parquet(results / "data")) == 5
