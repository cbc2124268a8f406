"""Scaling out and rerunning cheaply, as users run it: one unsharded sweep fills the compile and
reference caches; two shards (one from --shard, one from a SLURM array's environment) rerun it
as separate pytest sessions, cover every item exactly once, hit the caches, and merge into the
dataset the unsharded sweep gave; `neuron-support diff` gates a planted regression."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from faultkit import assert_outcomes

from pytest_neuron_support import zoo

pytestmark = pytest.mark.slow

# Two of the zoo's quickest to compile, one per shard: what is checked here is the sharding and the
# caches (how assign() balances more items than shards is test_sharding's). A third model cost this
# test, which starts first and runs beside the sweep, another cold compile and three more runs.
MODELS = ["tiny-random/qwen3", "tiny-random/llama"]
# What a run decides, as opposed to when and how fast it ran.
OUTCOME = [
    "result",
    "failure_stage",
    "tokens",
    "text",
    "reference_tokens",
    "reference_match",
    "neuron_cores",
    "tp_size",
    "ep_size",
    "plan_reason",
    "settings_hash",
    "runscript",
]

BREAK_LLAMA = """
def pytest_neuron_support_post_load(config, model):
    if model.id == "tiny-random/llama":
        return "with torch.no_grad():\\n    model.model.norm.weight.mul_(-1.0)\\n"
    return None
"""


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_neuron_support.cli", *args], capture_output=True, text=True, check=False
    )


def outcomes(results: Path) -> pd.DataFrame:
    df = pd.read_parquet(results / "data").set_index("model_id").sort_index()
    return df[OUTCOME].map(lambda v: tuple(v) if hasattr(v, "tolist") else v)


@pytest.mark.usefixtures("cold_inductor_cache")
def test_shards_cover_every_item_once_hit_the_caches_and_merge_into_the_unsharded_dataset(
    pytester: pytest.Pytester, offline_hub: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first session is cold (every row a cache miss): its device runs compile into --neff-cache, a
    # folder of this test's own; the fixture gives every other process of the test its own inductor
    # cache too, so nothing of it is served from the machine-wide <tmp>/torchinductor_<user>.
    prompt = json.dumps(zoo.TINY_PROMPT)
    pytester.makefile(
        ".yaml",
        models="models:\n" + "".join(f"  - {{id: {m}, task: text-generation, prompt: {prompt}}}\n" for m in MODELS),
    )
    caches = ["--neff-cache=compile-cache", "--reference-cache=reference-cache"]

    cold = pytester.runpytest_subprocess("--device=cpu", "-n", "2", "--results-dir=all", *caches)
    assert_outcomes(cold, pytester.path / "all", passed=len(MODELS))
    first = pd.read_parquet(pytester.path / "all" / "data")
    assert not first.reference_cached.any()

    shard0 = pytester.runpytest_subprocess("--device=cpu", "--shard=0/2", "--results-dir=shard0", *caches)
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "2")
    shard1 = pytester.runpytest_subprocess("--device=cpu", "--results-dir=shard1", *caches)
    monkeypatch.delenv("SLURM_ARRAY_TASK_ID")
    monkeypatch.delenv("SLURM_ARRAY_TASK_COUNT")
    ran = [set(pd.read_parquet(pytester.path / name / "data").model_id) for name in ("shard0", "shard1")]
    assert ran[0] and ran[1] and not ran[0] & ran[1] and ran[0] | ran[1] == set(MODELS)  # each item once
    for result, name, mine in zip((shard0, shard1), ("shard0", "shard1"), ran, strict=True):
        assert_outcomes(result, pytester.path / name, passed=len(mine), deselected=len(MODELS) - len(mine))

    # The warm shards say the caches hit: every graph from the compile cache, every reference cached.
    warm = pd.concat([pd.read_parquet(pytester.path / name / "data") for name in ("shard0", "shard1")])
    assert (warm.persistent_cache_hits >= 1).all() and (warm.persistent_cache_misses == 0).all(), warm[
        ["model_id", "persistent_cache_hits", "persistent_cache_misses"]
    ]
    assert warm.reference_cached.all() and (warm.reference_s == 0).all()
    assert (first.persistent_cache_misses >= 1).all()

    merged = cli("merge", "shard0", "shard1", "--into", str(pytester.path / "merged"))
    assert merged.returncode == 0, merged.stderr
    pd.testing.assert_frame_equal(outcomes(pytester.path / "merged"), outcomes(pytester.path / "all"))
    same = cli("diff", str(pytester.path / "all"), str(pytester.path / "merged"))
    assert same.returncode == 0 and same.stdout.splitlines()[-1] == f"{len(MODELS)} unchanged", same.stdout

    # A later run where one model broke: diff names it and exits 1, so CI can gate on it.
    pytester.makeconftest(BREAK_LLAMA)
    broken = pytester.runpytest_subprocess("--device=cpu", "--results-dir=later", "-k", "llama", *caches)
    assert_outcomes(broken, pytester.path / "later", failed=1, deselected=len(MODELS) - 1)
    gate = cli("diff", "all", "later")
    assert gate.returncode == 1
    assert "regressed  tiny-random/llama [cpu]: PASS -> FAIL" in gate.stdout.splitlines()
