"""Every way a model can break is a row with the right result and stage, and the sweep goes on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from pytest_neuron_support import zoo

pytestmark = pytest.mark.slow

# Faults are injected into the device run of chosen models through the plugin's post-load hook.
FAULTS = """
FAULTS = {
    "tiny-random/llama": "import os, signal\\nos.kill(os.getpid(), signal.SIGSEGV)\\n",
    "tiny-random/mistral": "import time\\ntime.sleep(600)\\n",
    "tiny-random/phi3": "blob = bytearray(64 << 30)\\n",
    # The backend rejects the graph, as neuronx-cc does with an unsupported operation.
    "tiny-random/smollm3": (
        "import torch._inductor.compile_fx as compile_fx\\n"
        "def refuse(*args, **kwargs):\\n"
        "    raise NotImplementedError('aten::fancy_op is not supported by this backend')\\n"
        "compile_fx.compile_fx = refuse\\n"
    ),
}


def pytest_neuron_support_post_load(config, model):
    return FAULTS.get(model.id)
"""


def catalog(*ids: str) -> str:
    prompt = json.dumps(zoo.TINY_PROMPT)
    return "models:\n" + "".join(f"  - {{id: {i}, task: text-generation, prompt: {prompt}}}\n" for i in ids)


def alive_pids_running(marker: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            status = (proc / "status").read_text()
        except OSError:
            continue
        if marker in cmdline and "State:\tZ" not in status:
            pids.append(int(proc.name))
    return pids


def test_crash_hang_memory_and_compile_faults_are_rows_and_the_sweep_goes_on(
    pytester: pytest.Pytester, offline_hub: Path
) -> None:
    pytester.makeconftest(FAULTS)
    pytester.makefile(
        ".yaml",
        models=catalog(
            "tiny-random/llama", "tiny-random/mistral", "tiny-random/phi3", "tiny-random/smollm3", "tiny-random/qwen3"
        ),
    )
    result = pytester.runpytest_subprocess(
        "--device=cpu", "-n", "2", "--results-dir=out", "--model-timeout=60", "--host-memory-gib=16"
    )
    result.assert_outcomes(passed=1, failed=4)
    df = pd.read_parquet(pytester.path / "out" / "data").set_index("model_id")

    crash = df.loc["tiny-random/llama"]
    assert (crash.result, crash.failure_stage) == ("ERROR", "load")
    assert "killed by SIGSEGV" in crash.error

    hang = df.loc["tiny-random/mistral"]
    assert (hang.result, hang.failure_stage) == ("TIMEOUT", "load")
    assert "exceeded the timeout" in hang.error
    assert alive_pids_running("tiny-random--mistral") == []  # the whole process group is gone

    memory = df.loc["tiny-random/phi3"]
    assert (memory.result, memory.failure_stage) == ("ERROR", "load")
    assert memory.error.startswith("MemoryError")

    compile_error = df.loc["tiny-random/smollm3"]
    assert (compile_error.result, compile_error.failure_stage) == ("ERROR", "compile")
    assert "aten::fancy_op is not supported" in compile_error.error

    assert df.loc["tiny-random/qwen3", "result"] == "PASS"


def test_a_killed_session_keeps_finished_rows_and_resume_runs_the_rest_once(
    pytester: pytest.Pytester, offline_hub: Path
) -> None:
    ids = ["tiny-random/qwen3", "tiny-random/qwen2", "tiny-random/llama"]
    pytester.makefile(".yaml", models=catalog(*ids))
    out = pytester.path / "out"
    session = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--device=cpu", f"--results-dir={out}"],
        cwd=pytester.path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    parts = out / ".parts"
    deadline = time.monotonic() + 600
    while not list(parts.glob("*/*.json")) and time.monotonic() < deadline:
        time.sleep(0.5)
    os.killpg(session.pid, signal.SIGKILL)  # the whole session, mid-sweep, no cleanup
    session.wait()
    finished = [json.loads(p.read_text())["model_id"] for p in parts.glob("*/*.json")]
    assert len(finished) >= 1 and not (out / "data").exists()

    result = pytester.runpytest_subprocess("--device=cpu", f"--results-dir={out}", "--resume", "-rs")
    df = pd.read_parquet(out / "data")
    assert sorted(df.model_id) == sorted(ids)  # nothing lost, nothing twice
    assert set(df.result) == {"PASS"}
    skipped = [line for line in result.outlines if "resumed: PASS already recorded" in line]
    assert len(skipped) == len(set(finished))
    result.assert_outcomes(passed=len(ids) - len(set(finished)), skipped=len(set(finished)))


def test_tokens_never_reach_run_py_rows_logs_or_output(pytester: pytest.Pytester, offline_hub: Path) -> None:
    canary = "hf_CANARYcanary0123456789abcdefghijkl"
    pytester.makefile(".yaml", models=catalog("tiny-random/qwen3", "tiny-broken/missing"))
    os.environ["HF_TOKEN"] = canary
    try:
        result = pytester.runpytest_subprocess("--device=cpu", "--results-dir=out")
    finally:
        del os.environ["HF_TOKEN"]
    result.assert_outcomes(passed=1, failed=1)
    assert canary not in "\n".join(result.outlines + result.errlines)
    for path in (pytester.path / "out").rglob("*"):
        if path.is_file():
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
