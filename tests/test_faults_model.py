"""Model faults: a model that crashes the interpreter, hangs past --model-timeout, exhausts host
memory, uses an operation the compiler rejects, or compiles nothing is a row with the right result
and stage, its CPU reference is stopped when the device run dies, and the next item still runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
from faultkit import (
    SITECUSTOMIZE,
    alive_at_report,
    assert_outcomes,
    catalog,
    own_processes,
    record_tree,
    recorded,
    report_alive_conftest,
)

pytestmark = pytest.mark.slow


# Faults are injected into the device run of chosen models through the plugin's post-load hook.
FAULTS = """
FAULTS = {
    "tiny-random/llama": "import os, signal\\nos.kill(os.getpid(), signal.SIGSEGV)\\n",
    "tiny-random/mistral": "import time\\ntime.sleep(600)\\n",
    "tiny-random/phi3": "blob = bytearray(64 << 30)\\n",
    # A stand-in, not the compiler: the inductor entry point is replaced by a function that raises,
    # as a backend raises on an operation it does not support.
    "tiny-random/smollm3": (
        "import torch._inductor.compile_fx as compile_fx\\n"
        "def refuse(*args, **kwargs):\\n"
        "    raise NotImplementedError('aten::fancy_op is not supported by this backend')\\n"
        "compile_fx.compile_fx = refuse\\n"
    ),
    # A real rejection: an operator with no fake (meta) implementation runs eagerly (the prefill)
    # but cannot be traced, so compiling the decoding step fails in torch.compile itself.
    "tiny-random/qwen2": (
        "@torch.library.custom_op('faults::no_fake', mutates_args=())\\n"
        "def no_fake(x: torch.Tensor) -> torch.Tensor:\\n"
        "    return x.clone()\\n"
        "model.lm_head.register_forward_pre_hook(lambda module, args: (no_fake(args[0]),))\\n"
    ),
    # Compilation switched off: transformers only logs that it skips it, and run.py must refuse
    # to pass a run meant to compile that compiled nothing.
    "tiny-random/gpt2": "model.generation_config.disable_compile = True\\n",
}


def pytest_neuron_support_post_load(config, model):
    return FAULTS.get(model.id)
"""

# The crashing model's CPU reference blocks from its start, so it is certainly running when the
# device run dies; on SIGTERM (what the harness's stop sends first) it writes down whether the
# model's row has been reported yet. Stopped because the device run died, it has not: the item
# reports only after the stop. Left to end by the timeout or with the session, it has (or the
# reference never wrote anything).
BLOCK_REFERENCE = """

def _block_llama_reference():
    import glob, signal, time
    cwd = _os.getcwd()
    if not cwd.endswith(_os.path.join("tiny-random--llama", "cpu", "reference")):
        return
    out = _os.path.dirname(_os.path.dirname(_os.path.dirname(_os.path.dirname(cwd))))

    def stopped(signum, frame):
        parts = glob.glob(_os.path.join(out, ".parts", "*", "*.json"))
        rows = [p for p in parts if "tiny-random/llama" in open(p).read()]
        with open(_os.path.join(cwd, "stopped.json"), "w") as handle:
            _json.dump({"row_reported": bool(rows)}, handle)
        _os._exit(1)

    signal.signal(signal.SIGTERM, stopped)
    while True:
        time.sleep(1)


_block_llama_reference()
"""


def test_crash_hang_memory_and_compile_faults_are_rows_and_the_sweep_goes_on(
    pytester: pytest.Pytester, offline_hub: Path, process_tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makeconftest(FAULTS + report_alive_conftest())
    record = pytester.path / "record"
    for name, value in record_tree(record, SITECUSTOMIZE + BLOCK_REFERENCE).items():
        monkeypatch.setenv(name, value)
    models = catalog(
        "tiny-random/llama",
        "tiny-random/mistral",
        "tiny-random/phi3",
        "tiny-random/smollm3",
        "tiny-random/qwen2",
        "tiny-random/gpt2",
        "tiny-random/qwen3",
    )
    # The hanging model's own timeout (the entry's field): the sweep waits 45 s for it, not the
    # --model-timeout every other model may need to compile on a loaded 2-CPU machine.
    pytester.makefile(
        ".yaml", models=models.replace("{id: tiny-random/mistral,", "{id: tiny-random/mistral, timeout: 45,")
    )
    result = pytester.runpytest_subprocess(
        "--device=cpu",
        "-n",
        "2",
        "--results-dir=out",
        "--model-timeout=180",
        "--host-memory-gib=16",
        # The crashing model's reference must start (a cached one is not run, and could not be stopped).
        "--reference-cache=none",
        # Every CPU-side script a fresh interpreter: the recorder and the blocked reference above are a
        # sitecustomize, which runs as an interpreter starts, and a warm start is a fork of one already
        # started (tests/test_forkserver.py checks that a stopped warm script and its children end).
        "--cpu-side-starts=fresh",
    )
    assert_outcomes(result, pytester.path / "out", passed=1, failed=6)
    df = pd.read_parquet(pytester.path / "out" / "data").set_index("model_id")
    runs = pytester.path / "out" / "runs"

    crash = df.loc["tiny-random/llama"]
    assert (crash.result, crash.failure_stage) == ("ERROR", "load")
    assert "killed by SIGSEGV" in crash.error
    # Its CPU reference, started beside the device run and still running (it blocks), was
    # stopped when the device run died: before the item reported, not at the session's end.
    marker = runs / "tiny-random--llama" / "cpu" / "reference" / "stopped.json"
    assert marker.exists(), "the reference was never sent SIGTERM: nothing stopped it before the session ended"
    stopped = json.loads(marker.read_text())
    assert stopped == {"row_reported": False}
    assert [r for r in alive_at_report(record, "tiny-random/llama") if r.under(runs / "tiny-random--llama")] == []

    hang = df.loc["tiny-random/mistral"]
    assert (hang.result, hang.failure_stage) == ("TIMEOUT", "load")
    waited = re.search(r"exceeded the timeout after (\d+)s", hang.error)
    assert waited is not None and 45 <= int(waited.group(1)) < 90, hang.error  # the entry's, not --model-timeout
    # run.py was there while it hung, and the whole process group was gone when the item reported.
    hung = [r for r in recorded(record) if r.under(runs / "tiny-random--mistral" / "cpu" / "device")]
    assert any(a.endswith("run.py") for r in hung for a in r.argv), hung
    assert [r for r in alive_at_report(record, "tiny-random/mistral") if r.under(runs / "tiny-random--mistral")] == []

    memory = df.loc["tiny-random/phi3"]
    assert (memory.result, memory.failure_stage) == ("ERROR", "load")
    assert memory.error.startswith("MemoryError")

    backend = df.loc["tiny-random/smollm3"]
    assert (backend.result, backend.failure_stage) == ("ERROR", "compile")
    assert "aten::fancy_op is not supported" in backend.error

    rejected = df.loc["tiny-random/qwen2"]
    assert (rejected.result, rejected.failure_stage) == ("ERROR", "compile"), rejected.error
    assert "no fake impl registered for <CustomOpDef(faults::no_fake)>" in rejected.error, rejected.error

    eager = df.loc["tiny-random/gpt2"]
    assert (eager.result, eager.failure_stage) == ("ERROR", "compile"), eager.error
    assert eager.error.startswith("NothingCompiledError: generate() compiled no graph"), eager.error

    assert df.loc["tiny-random/qwen3", "result"] == "PASS"
    # Nothing the sweep started is left: no recorded process, no process with this test's tag.
    assert [r for r in recorded(record) if r.alive()] == []
    assert own_processes(process_tag) == []
