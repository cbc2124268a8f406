"""Model faults: a model that crashes the interpreter, hangs past --model-timeout, exhausts host
memory, or meets an operation its compiler rejects is a row with the right result and stage, and
the next item still runs."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from faultkit import catalog, own_processes

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


def test_crash_hang_memory_and_compile_faults_are_rows_and_the_sweep_goes_on(
    pytester: pytest.Pytester, offline_hub: Path, process_tag: str
) -> None:
    pytester.makeconftest(FAULTS)
    pytester.makefile(
        ".yaml",
        models=catalog(
            "tiny-random/llama", "tiny-random/mistral", "tiny-random/phi3", "tiny-random/smollm3", "tiny-random/qwen3"
        ),
    )
    result = pytester.runpytest_subprocess(
        # Long enough for the healthy model to compile on a loaded 2-CPU machine; the hang hits it.
        "--device=cpu",
        "-n",
        "2",
        "--results-dir=out",
        "--model-timeout=180",
        "--host-memory-gib=16",
    )
    result.assert_outcomes(passed=1, failed=4)
    df = pd.read_parquet(pytester.path / "out" / "data").set_index("model_id")

    crash = df.loc["tiny-random/llama"]
    assert (crash.result, crash.failure_stage) == ("ERROR", "load")
    assert "killed by SIGSEGV" in crash.error
    # Its CPU reference, started beside the device run, was stopped when the device run died.
    # This test's own processes only (by tag), in the model's run directory (by cwd or path).
    runs = pytester.path / "out" / "runs"
    assert own_processes(process_tag, under=runs / "tiny-random--llama") == []

    hang = df.loc["tiny-random/mistral"]
    assert (hang.result, hang.failure_stage) == ("TIMEOUT", "load")
    assert "exceeded the timeout" in hang.error
    assert own_processes(process_tag, under=runs / "tiny-random--mistral") == []  # the whole process group is gone

    memory = df.loc["tiny-random/phi3"]
    assert (memory.result, memory.failure_stage) == ("ERROR", "load")
    assert memory.error.startswith("MemoryError")

    compile_error = df.loc["tiny-random/smollm3"]
    assert (compile_error.result, compile_error.failure_stage) == ("ERROR", "compile")
    assert "aten::fancy_op is not supported" in compile_error.error

    assert df.loc["tiny-random/qwen3", "result"] == "PASS"
    assert own_processes(process_tag) == []  # nothing the sweep started is left, orphans included
