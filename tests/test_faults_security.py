"""Security: tokens never reach run.py, rows, logs or output, and Hub remote code runs only when
the catalog entry and the user both opt in (a local checkpoint whose code writes a marker file)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
from faultkit import catalog

from pytest_neuron_support import zoo

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("eager_compile")]


# The device runs print the token the harness gave them (it is in their environment: downloads
# need it) to stdout and stderr, and one raises with it in its error, so every path a token could
# leak by is exercised: the run's log.txt and result.json, its row's error, the terminal. The
# code reads the token from the environment, so run.py itself never holds it.
LEAK_TOKEN = """
LEAK = (
    "import os, sys\\n"
    "print('canary-stdout:', os.environ['HF_TOKEN'], flush=True)\\n"
    "print('canary-stderr:', os.environ['HF_TOKEN'], file=sys.stderr, flush=True)\\n"
)


def pytest_neuron_support_post_load(config, model):
    if model.id == "tiny-random/qwen3":
        return LEAK
    if model.id == "tiny-random/llama":
        return LEAK + "raise RuntimeError('canary-error: ' + os.environ['HF_TOKEN'])\\n"
    return None
"""


def test_tokens_never_reach_run_py_rows_logs_or_output(pytester: pytest.Pytester, offline_hub: Path) -> None:
    canary = "hf_CANARYcanary0123456789abcdefghijkl"
    pytester.makeconftest(LEAK_TOKEN)
    pytester.makefile(".yaml", models=catalog("tiny-random/qwen3", "tiny-random/llama", "tiny-broken/missing"))
    os.environ["HF_TOKEN"] = canary
    try:
        result = pytester.runpytest_subprocess("--device=cpu", "--results-dir=out")
    finally:
        del os.environ["HF_TOKEN"]
    result.assert_outcomes(passed=1, failed=2)
    out = pytester.path / "out"
    terminal = "\n".join(result.outlines + result.errlines)
    assert canary not in terminal
    # The leak happened and was masked (else the checks below would pass on a run that printed
    # nothing): the raising run's error reached the terminal, the row and result.json masked, and
    # both runs' prints are in their logs masked.
    assert "canary-error: ***" in terminal
    df = pd.read_parquet(out / "data").set_index("model_id")
    assert canary not in df.to_csv()  # every column of every row, as text
    leaked = df.loc["tiny-random/llama"]
    assert (leaked.result, leaked.failure_stage) == ("ERROR", "load")
    assert leaked.error == "RuntimeError: canary-error: ***", leaked.error
    runs = out / "runs"
    for slug in ("tiny-random--qwen3", "tiny-random--llama"):
        log = (runs / slug / "cpu" / "device" / "log.txt").read_text()
        assert "canary-stdout: ***" in log and "canary-stderr: ***" in log, log[-2000:]
    error = json.loads((runs / "tiny-random--llama" / "cpu" / "device" / "result.json").read_text())
    assert error["error"] == "canary-error: ***"
    assert "canary-error: ***" in error["traceback"]
    files = [path for path in out.rglob("*") if path.is_file()]
    assert len(files) > 10, files  # the results directory holds the runs, not just the dataset
    for path in files:
        assert canary.encode() not in path.read_bytes(), path


REMOTE_CODE = """
from pathlib import Path
from transformers.models.llama.modeling_llama import LlamaForCausalLM

Path({marker!r}).write_text("remote code ran")


class MarkerForCausalLM(LlamaForCausalLM):
    pass
"""


def install_remote_code_model(cache: Path, marker: Path, work: Path) -> None:
    repo = cache / "models--tiny-random--llama"
    snapshot = repo / "snapshots" / (repo / "refs" / "main").read_text().strip()
    files = work / "remote"
    files.mkdir()
    for f in snapshot.iterdir():
        (files / f.name).write_bytes(f.read_bytes())
    config = json.loads((files / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_marker.MarkerForCausalLM"}
    (files / "config.json").write_text(json.dumps(config))
    (files / "modeling_marker.py").write_text(REMOTE_CODE.format(marker=str(marker)))
    zoo.install_snapshot(cache, "tiny-remote/marker", files)


def test_remote_code_runs_only_when_catalog_and_user_both_opt_in(
    pytester: pytest.Pytester, offline_hub: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = pytester.path / "hub"
    import shutil

    shutil.copytree(offline_hub, cache, symlinks=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    marker = pytester.path / "marker.txt"
    install_remote_code_model(cache, marker, pytester.path)
    prompt = json.dumps(zoo.TINY_PROMPT)
    trusted = "trust_remote_code: true"
    pytester.makefile(
        ".yaml",
        models=f"models:\n  - {{id: tiny-remote/marker, task: text-generation, {trusted}, prompt: {prompt}}}\n",
    )
    refused = pytester.runpytest_subprocess("--device=cpu", "--results-dir=out", "-rs")
    refused.assert_outcomes(skipped=1)
    assert not marker.exists()
    row = pd.read_parquet(pytester.path / "out" / "data").iloc[0]
    assert (row.result, row.exclude_reason) == ("EXCLUDED", "remote-code")

    # The catalog does not opt in: even with the user's flag, transformers is never told to trust the
    # repository, so it loads its own Llama class and the repository's code never runs.
    pytester.makefile(
        ".yaml", models=f"models:\n  - {{id: tiny-remote/marker, task: text-generation, prompt: {prompt}}}\n"
    )
    not_opted = pytester.runpytest_subprocess("--device=cpu", "--results-dir=out2", "--allow-remote-code")
    not_opted.assert_outcomes(passed=1)
    assert not marker.exists()
    assert (
        "trust_remote_code': False"
        in (pytester.path / "out2" / "runs" / "tiny-remote--marker" / "cpu" / "device" / "run.py").read_text()
    )

    pytester.makefile(
        ".yaml",
        models=f"models:\n  - {{id: tiny-remote/marker, task: text-generation, {trusted}, prompt: {prompt}}}\n",
    )
    allowed = pytester.runpytest_subprocess("--device=cpu", "--results-dir=out3", "--allow-remote-code")
    allowed.assert_outcomes(passed=1)
    assert marker.read_text() == "remote code ran"
