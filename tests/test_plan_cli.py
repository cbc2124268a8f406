"""Plans before anything runs (issue 30): ``pytest --collect-only -v`` prints every item's plan (cores,
tp/ep, memory per core, reason) and leaves the last run's status.json alone; ``neuron-support plan``
answers which trn2 sizes hold a model, from the loopback Hub's API or offline from the local cache."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
CONFIGS = Path(__file__).resolve().parent / "fixtures" / "configs"


def plan_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_neuron_support.cli", "plan", *args],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        timeout=120,
    )


def test_collect_only_verbose_prints_every_plan_and_keeps_the_last_runs_status(
    pytester: pytest.Pytester, offline_hub: Path
) -> None:
    shutil.copy(REPO / "models-tiny.yaml", pytester.path / "models.yaml")
    # status.json of the last sweep that ran items: a collect-only session must not replace it.
    status = pytester.path / "out" / "status.json"
    status.parent.mkdir()
    last_run = json.dumps({"pid": 1, "device": "cpu", "pool": 2, "ledger": "", "started": 1.0, "finished": True})
    status.write_text(last_run)
    result = pytester.runpytest_subprocess(
        "--collect-only", "-v", "--device=cpu", "--neuron-cores=2", "--results-dir=out"
    )
    assert result.ret == 0, result.stdout.str()
    lines = result.stdout.lines
    assert "neuron-support plans (cpu, pool of 2 core(s)):" in lines
    plans = {
        line.split(": ", 1)[0].strip(): line.split(": ", 1)[1] for line in lines if line.startswith("  models.yaml::")
    }
    qwen3 = plans["models.yaml::test_model[tiny-random/qwen3]"]
    assert qwen3.startswith("1 core(s), tp=1 ep=1, "), qwen3
    assert " MiB per core: " in qwen3 and qwen3.endswith("fit 1 core of 18.0 usable GiB; no sharding needed")
    mistral = plans["models.yaml::test_model[tiny-random/mistral]"]
    assert mistral.startswith("2 core(s), tp=2 ep=1, ") and "per core: catalog override: 2 cores;" in mistral
    assert "tp=2 divides" in mistral
    # A plan the pool cannot hold says so before anything runs, with the option that changes it.
    olmo2 = plans["models.yaml::test_model[tiny-random/olmo2]"]
    assert olmo2.startswith("4 core(s), tp=4 ep=1, ")
    assert olmo2.endswith("; SKIPPED here: the pool has 2 core(s); pass --neuron-cores=4 or more"), olmo2
    models = {m.split("#")[0].strip() for m in (REPO / "models-tiny.yaml").read_text().splitlines()}
    ids = {m.removeprefix("- id: ") for m in models if m.startswith("- id: ")}
    assert {f"models.yaml::test_model[{i}]" for i in ids} <= set(plans), sorted(plans)
    assert status.read_text() == last_run


def _record(name: str, model_id: str) -> Any:
    """A loopback-Hub repo of a real model: its config.json and its parameter count as one tensor (the
    planner reads the count from the safetensors header; no weight is served)."""
    from hubserver import ModelRecord

    data = json.loads((CONFIGS / f"{name}.json").read_text(encoding="utf-8"))
    tensors = {f"w_{dtype.lower()}": (dtype, [count]) for dtype, count in data["parameters"].items()}
    return ModelRecord(id=model_id, files={"config.json": json.dumps(data["config"]).encode()}, tensors=tensors)


def test_plan_answers_which_trn2_sizes_hold_a_model_from_the_hub_api(tmp_path: Path) -> None:
    from hubserver import HubServer

    records = [
        _record("meta-llama_Llama-3.3-70B-Instruct", "meta-llama/Llama-3.3-70B-Instruct"),
        _record("deepseek-ai_DeepSeek-V3", "deepseek-ai/DeepSeek-V3"),
    ]
    with HubServer(records) as server:
        env = {**os.environ, **server.env(), "HF_HUB_CACHE": str(tmp_path / "hub")}
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
            env.pop(name, None)
        done = plan_cli("meta-llama/Llama-3.3-70B-Instruct", "deepseek-ai/DeepSeek-V3", env=env)
        asked = [request.path for request in server.requests]
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    # 70B in bf16: 131.4 GiB, 8 cores of 18 usable GiB; a trn2.3xlarge has 4.
    llama = lines.index(next(line for line in lines if line.startswith("meta-llama/Llama-3.3-70B-Instruct ")))
    assert lines[llama].startswith("meta-llama/Llama-3.3-70B-Instruct (revision main): 70.6B weights (hub api), ")
    assert lines[llama + 1] == (
        "  trn2.3xlarge (1 chip, 4 cores): SKIPPED: needs 8 cores (131.4 GiB of bfloat16 weights at 18.0 usable "
        "GiB per core), more than the 4 cores of a trn2.3xlarge"
    )
    assert lines[llama + 2].startswith(
        "  trn2.48xlarge (16 chips, 64 cores): 8 core(s), tp=8 ep=1, 16.4 GiB per core: "
    )
    assert lines[llama + 2].endswith("tp=8 divides 64 heads and 8 kv heads")
    assert lines[llama + 3] == "  fits: trn2.48xlarge"
    # DeepSeek-V3 fits nowhere: each size says why not.
    deepseek = lines.index(next(line for line in lines if line.startswith("deepseek-ai/DeepSeek-V3 ")))
    assert "needs 128 cores" in lines[deepseek + 1] and "the 4 cores of a trn2.3xlarge" in lines[deepseek + 1]
    assert "needs 128 cores" in lines[deepseek + 2]
    assert "the harness's 16 cores per model (--max-cores; a trn2.48xlarge has 64)" in lines[deepseek + 2]
    assert lines[deepseek + 3] == "  fits none of trn2.3xlarge, trn2.48xlarge"
    assert any("model.safetensors" in path for path in asked)  # counted from headers, no weights fetched


def test_plan_offline_answers_from_the_local_cache(offline_hub: Path) -> None:
    done = plan_cli("tiny-random/qwen3_moe", "tiny-random/not-in-the-cache")
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "the Hub is not asked (HF_HUB_OFFLINE=1): planning from the local Hugging Face cache only"
    assert lines[1].startswith("tiny-random/qwen3_moe (revision main): ") and "(hub cache)" in lines[1]
    assert "experts" in lines[1]
    assert lines[2].startswith("  trn2.3xlarge (1 chip, 4 cores): 1 core(s), tp=1 ep=1, ")
    assert lines[4] == "  fits: trn2.3xlarge, trn2.48xlarge"
    # The plugin's own one-line offline message (never huggingface_hub's advice to set local_files_only).
    assert (
        "neuron-support plan: tiny-random/not-in-the-cache (revision main) is not in the local Hugging Face cache"
        in done.stderr
    )
    assert "local_files_only" not in done.stderr


def test_plan_rejects_a_core_count_naming_the_flag() -> None:
    done = plan_cli("org/any", "--max-cores", "3")
    assert done.returncode == 2
    assert "--max-cores=3 is not a core count; pass one of 1, 2, 4, 8, 16" in done.stderr
