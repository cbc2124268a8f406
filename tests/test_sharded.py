"""Sharded runs (run.py spawns its own gloo ranks) and the fluency judge, on the tiny zoo."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pandas as pd
import pytest
from faultkit import assert_outcomes

from pytest_neuron_support import zoo
from pytest_neuron_support.devices.table import DEVICES
from pytest_neuron_support.run.execution import run_script
from pytest_neuron_support.run.runscript import JudgeSpec, RunSpec, render, render_judge

sys.path.insert(0, str(Path(__file__).parent))
from judges import build_judge, expected_score, no_ids, yes_ids

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("eager_compile")]


@pytest.fixture(scope="module")
def judges(tiny_zoo_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("judges")
    return {
        "yes": build_judge(tiny_zoo_cache, base / "yes", yes_logit=6.0, no_logit=1.0),
        "no": build_judge(tiny_zoo_cache, base / "no", yes_logit=0.5, no_logit=5.0),
    }


@pytest.mark.parametrize(("which", "yes_logit", "no_logit"), [("yes", 6.0, 1.0), ("no", 0.5, 5.0)])
def test_judge_verdict_comes_from_yes_no_logprobs(
    judges: dict[str, Path], tmp_path: Path, which: str, yes_logit: float, no_logit: float
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(judges[which])
    n_yes, n_no = len(yes_ids(tokenizer)), len(no_ids(tokenizer))
    assert not set(yes_ids(tokenizer)) & set(no_ids(tokenizer))
    script = tmp_path / "judge.py"
    script.write_text(render_judge(JudgeSpec(str(judges[which]), "main", "The press spread books.")))
    outcome = run_script(script, tmp_path / "v.json", env=os.environ, timeout=300, log_path=tmp_path / "log")
    verdict = outcome.result
    assert verdict is not None and verdict["ok"], outcome.log_tail()
    assert verdict["score"] == pytest.approx(expected_score(n_yes, n_no, yes_logit, no_logit), abs=1e-4)
    assert verdict["fluent"] is (which == "yes")


#: Per transformers release (major.minor): which of the expert-parallel candidates below loads
#: (its index) and what the ones before it fail with. This is the premise run.py's fallback list
#: rests on (pipeline.distributed_configs' docstring); a release not listed fails the test below
#: until someone checks what it does and adds it.
EP_PREMISE: dict[str, tuple[int, str]] = {
    # The experts-only config has no TP plan to shard by ("... requested, but <class> has no
    # `tp_plan`. Pass `tp_plan` in `DistributedConfig`, ..."); tensor parallel over the experts loads.
    "5.24": (1, "Pass `tp_plan` in `DistributedConfig`"),
    # Checked with `bash .ci/upstream -k ep_candidates` on 5.25.0: the experts-only config loads as the
    # docstring recommends, so nothing is tried before it.
    "5.25": (0, ""),
}


def test_ep_candidates_are_tried_in_order_and_the_working_one_is_recorded(offline_hub: Path, tmp_path: Path) -> None:
    # The experts-only config the docstring recommends fails on transformers 5.24 (and loads on 5.25);
    # run.py must detect a failure and fall through to one that loads, recording both.
    import transformers

    release = ".".join(transformers.__version__.split(".")[:2])
    assert release in EP_PREMISE, f"transformers {transformers.__version__}: check which config loads, add it"
    loads, failure = EP_PREMISE[release]
    spec = RunSpec(
        model="tiny-random/qwen3_moe",
        revision="main",
        task="text-generation",
        dtype="bfloat16",
        prompt=zoo.TINY_PROMPT,
        max_new_tokens=8,
        device=DEVICES["cpu"],
        compile=False,
        compile_backend="inductor",
        world_size=2,
        distributed_configs=(
            {"ep_size": 2, "tp_plan": {}},
            {"tp_size": 2, "ep_size": 2},
            {"fsdp_size": 2, "ep_size": 2},
        ),
    )
    script = tmp_path / "run.py"
    script.write_text(render(spec))
    outcome = run_script(script, tmp_path / "r.json", env=os.environ, timeout=600, log_path=tmp_path / "log")
    result = outcome.result
    assert result is not None and result["ok"], outcome.log_tail()
    assert result["world_size"] == 2 and len(result["tokens"]) == 8
    # Exactly the candidates before the one that loads were tried, each failing as documented,
    # and the row names the one that loaded.
    attempts = result["distributed_attempts"]
    assert [a["config"] for a in attempts] == list(spec.distributed_configs[:loads])
    assert all(failure in a["error"] for a in attempts), attempts
    assert result["distributed_config"] == spec.distributed_configs[loads]


RANK1_RAISES = """
def pytest_neuron_support_post_load(config, model):
    if model.id == "tiny-random/mistral":
        return "import os\\nif os.environ['RANK'] == '1':\\n    raise RuntimeError('boom on rank 1')\\n"
    return None
"""


def test_sharded_items_run_two_ranks_get_a_judge_verdict_and_a_failing_rank_is_named(
    pytester: pytest.Pytester, offline_hub: Path, judges: dict[str, Path]
) -> None:
    pytester.makeconftest(RANK1_RAISES)
    prompt = json.dumps(zoo.TINY_PROMPT)
    pytester.makefile(
        ".yaml",
        models=(
            "models:\n"
            f"  - {{id: tiny-random/llama, task: text-generation, cores: 2, tags: [tp2], prompt: {prompt}}}\n"
            f"  - {{id: tiny-random/mistral, task: text-generation, cores: 2, tags: [tp2], prompt: {prompt}}}\n"
            f"  - {{id: tiny-random/qwen3, task: text-generation, prompt: {prompt}}}\n"
        ),
    )
    result = pytester.runpytest_subprocess(
        "--device=cpu",
        "--neuron-cores=2",
        "-k",
        "tp2",
        f"--judge-model={judges['yes']}",
        "--results-dir=out",
        "--model-timeout=900",
    )
    assert_outcomes(result, pytester.path / "out", passed=1, failed=1, deselected=1)
    df = pd.read_parquet(pytester.path / "out" / "data").set_index("model_id")
    assert "tiny-random/qwen3" not in df.index
    # (A sharded MoE model's PASS is the tiny-zoo sweep's: tests/test_sweep.py.)
    for model in ("tiny-random/llama",):
        row = df.loc[model]
        assert row.result == "PASS" and row.neuron_cores == 2 and row.tp_size == 2
        assert json.loads(row.distributed_config)["tp_size"] == 2
        assert row.judge_verdict == "fluent" and row.judge_score > 0.9
        assert row.judge_model == str(judges["yes"])
        # The teacher-forced CPU check decided; the judge's verdict is kept beside it.
        assert (row.verdict_basis, row.cpu_check, row.positions_checked, row.positions_disagreeing) == (
            "teacher-forced",
            "ran",
            32,
            0,
        )
        assert pd.isna(row.reference_match)  # no free-running reference for a sharded run
    failed = df.loc["tiny-random/mistral"]
    assert failed.result == "ERROR" and failed.failure_stage == "load"
    assert "rank 1" in failed.error and "boom on rank 1" in failed.error


def test_the_judge_is_kept_beside_the_cpu_check_and_fails_a_run_only_when_it_decides(
    pytester: pytest.Pytester, offline_hub: Path, judges: dict[str, Path]
) -> None:
    prompt = json.dumps(zoo.TINY_PROMPT)
    pytester.makefile(
        ".yaml", models=f"models:\n  - {{id: tiny-random/llama, task: text-generation, cores: 2, prompt: {prompt}}}\n"
    )
    # The CPU check agrees with every token: PASS, and the judge's "not fluent" is recorded, not obeyed.
    result = pytester.runpytest_subprocess(
        "--device=cpu", "--neuron-cores=2", f"--judge-model={judges['no']}", "--results-dir=checked"
    )
    assert_outcomes(result, pytester.path / "checked", passed=1)
    row = pd.read_parquet(pytester.path / "checked" / "data").iloc[0]
    assert (row.result, row.verdict_basis, row.judge_verdict) == ("PASS", "teacher-forced", "not fluent")
    assert row.judge_score < 0.1 and row.positions_disagreeing == 0
    # Without room for the CPU check the judge decides alone, and fails it.
    result = pytester.runpytest_subprocess(
        "--device=cpu",
        "--neuron-cores=2",
        f"--judge-model={judges['no']}",
        "--results-dir=judged",
        "--cpu-check-memory-gib=0.000001",
    )
    assert_outcomes(result, pytester.path / "judged", failed=1)
    row = pd.read_parquet(pytester.path / "judged" / "data").iloc[0]
    assert (row.result, row.failure_stage, row.verdict_basis, row.judge_verdict) == (
        "FAIL",
        "judge",
        "judge",
        "not fluent",
    )
    assert row.cpu_check.startswith("skipped: ") and pd.isna(row.positions_checked)
