"""The operations a device ran on the host, with their arguments' dtypes and shapes, and the standalone script
that makes each of those calls again alone.

No CPU falls back to anything, so the host fallback is planted for real: a stand-in for a device wheel
(``planted_wheel``), installed as a distribution whose ``torch.backends`` entry point torch autoloads in every
process that imports it (as torch-neuronx is; the CPU side's ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` keeps it out of the
CPU reference, and the tests' own ``=1`` lets it into the device run, where the cpu row would keep it out),
registers its own CPU kernel for ``aten::embedding`` through ``torch.library`` and lists the op once that kernel ran
on more than one token, as torch-neuronx's ``get_fallback_ops()`` lists an op it ran on the host: the prompt's
embeddings fall back, a decoding step's do not. A device row whose ``fallback_ops_expr`` reads that list stands in
for the neuron row.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from faultkit import assert_outcomes, planted_conftest

from pytest_neuron_support import zoo
from pytest_neuron_support.base.storage import slug
from pytest_neuron_support.devices.table import DEVICES
from pytest_neuron_support.run.fallbacks import FOLDER, REPRO_FOLDER
from pytest_neuron_support.run.runscript import RunSpec, render_and_run, template, with_spec

WHEEL = '''"""A device wheel whose host fallback is real: aten::embedding runs through this module's CPU kernel."""
import torch

FELL_BACK = []
_LIBRARY = torch.library.Library("aten", "IMPL")


def _embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    if indices.shape[-1] > 1:  # the prompt's embedding falls back; a decoding step's one token does not
        FELL_BACK.append("aten::embedding")
    return weight.index_select(0, indices.reshape(-1)).reshape(*indices.shape, weight.shape[-1])


_LIBRARY.impl("embedding", _embedding, "CPU")


def get_fallback_ops():
    return sorted(set(FELL_BACK))


def autoload():
    """torch's device-backend autoload calls this; importing the module registered the kernel."""
'''
#: Recorded arguments of calls made up for the replay: a float tensor and a mask of its shape.
TENSOR = {"tensor": "float32", "shape": [2, 3], "on": "cpu"}
MASK = {"tensor": "bool", "shape": [2, 3], "on": "cpu"}
#: What the device row evaluates for its fallback list: the planted wheel's.
LISTED = "__import__('planted_wheel').get_fallback_ops()"
GPT2 = "tiny-random/gpt2"


@pytest.fixture
def wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The planted wheel installed (its module, its dist-info, its autoload entry point) on the path of every
    process this test starts."""
    folder = tmp_path / "wheel"
    info = folder / "planted_wheel-0.1.dist-info"
    info.mkdir(parents=True)
    (folder / "planted_wheel.py").write_text(WHEEL)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: planted-wheel\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[torch.backends]\nplanted_wheel = planted_wheel:autoload\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")])))
    # The neuron row autoloads its wheel; the cpu row this stands in with keeps device backends out, under the
    # caller's own value (which the device run keeps, and the CPU side's 0 overrides).
    monkeypatch.setenv("TORCH_DEVICE_BACKEND_AUTOLOAD", "1")
    return folder


def run_spec(expr: str | None, **fields: object) -> RunSpec:
    device = dataclasses.replace(DEVICES["cpu"], fallback_ops_expr=expr)
    base: dict[str, object] = dict(
        model=GPT2,
        revision="main",
        task="text-generation",
        dtype="float32",
        prompt="Hello there",
        max_new_tokens=4,
        device=device,
        compile=False,
        compile_backend="eager",
    )
    base.update(fields)
    return RunSpec(**base)  # type: ignore[arg-type]


@pytest.mark.usefixtures("offline_hub", "wheel")
def test_the_calls_of_an_op_that_fell_back_are_recorded_and_replayed_alone(tmp_path: Path) -> None:
    env = dict(os.environ)
    # The device run: its list names the op that ran on the host.
    _, device = render_and_run(run_spec(LISTED), tmp_path / "device", env=env, timeout=300)
    assert device.result is not None and device.result["ok"], device.result
    assert device.result["fallback_ops"] == ["aten::embedding"]
    # The eager rerun records every distinct call of it with its arguments' dtypes and shapes.
    capture = run_spec(LISTED, capture_fallbacks=("aten::embedding",))
    _, rerun = render_and_run(capture, tmp_path / "rerun", env=env, timeout=300)
    assert rerun.result is not None and rerun.result["ok"], rerun.result
    calls = rerun.result["fallback_calls"]
    assert calls and {call["op"] for call in calls} == {"aten::embedding"}
    weights, indices = calls[0]["args"][:2]
    assert weights["tensor"] == "float32" and len(weights["shape"]) == 2 and weights["on"] == "cpu"
    assert indices["tensor"] == "int64" and indices["shape"][0] == 1
    assert calls[0]["words"].startswith(f"aten::embedding(float32{weights['shape']}, int64{indices['shape']}")
    assert sum(call["count"] for call in calls) >= 2  # the token and position embeddings, every step
    # The reproducer: no model, each call alone in a process of its own; the wheel's list names the op after the
    # prompt's calls only, and the decoding steps' calls are said to have stayed on the device.
    odd = [
        {"op": "aten::masked_fill.Scalar", "args": [TENSOR, MASK, {"float": "-inf"}], "kwargs": {}, "count": 1},
        {"op": "aten::add.Tensor", "args": [TENSOR, {"other": "<a generator>"}], "kwargs": {}, "count": 1},
    ]
    replay = run_spec(LISTED, replay_fallbacks=(*calls, *odd), model="org/not-downloaded")
    _, replayed = render_and_run(replay, tmp_path / "replay", env=env, timeout=300)
    assert replayed.result is not None and replayed.result["ok"], replayed.result
    lines = replayed.result["replayed"]
    assert len(lines) == len(calls) + 2
    for call, line in zip(calls, lines, strict=False):
        prompt = call["args"][1]["shape"][-1] > 1
        said = ": ran; fell back to the host" if prompt else ": ran; stayed on the device"
        assert line.endswith(said), (call, line)
    assert {call["args"][1]["shape"][-1] > 1 for call in calls} == {True, False}  # both kinds were recorded
    # A non-finite scalar is made again (a SPEC literal cannot hold -inf itself); an argument kept only as text is
    # not replayable, and says so, without stopping the calls after it.
    assert lines[-2].startswith("aten::masked_fill.Scalar(float32[2, 3], bool[2, 3], -inf) x1: ran; "), lines[-2]
    assert lines[-1].startswith("aten::add.Tensor(float32[2, 3], <a generator>) x1: not replayable: ValueError"), lines
    # The same calls on a device whose list stays empty: the reproducer says they stayed on it.
    stayed = run_spec("[]", replay_fallbacks=tuple(calls[:2]), model="org/not-downloaded")
    _, clean = render_and_run(stayed, tmp_path / "clean", env=env, timeout=300)
    assert clean.result is not None and clean.result["ok"], clean.result
    assert all(line.endswith("; stayed on the device") for line in clean.result["replayed"]), clean.result


@pytest.mark.usefixtures("offline_hub", "wheel", "eager_compile")
@pytest.mark.slow
def test_a_row_whose_device_fell_back_carries_the_calls_and_a_standalone_reproducer(
    pytester: pytest.Pytester,
) -> None:
    # The device run and its rerun read the wheel's list (post-load); the CPU reference runs without the wheel.
    plant = f"SPEC['device']['fallback_ops_expr'] = {LISTED!r}\n"
    pytester.makeconftest(planted_conftest({GPT2: plant}))
    prompt = json.dumps(zoo.TINY_PROMPT)
    pytester.makefile(".yaml", models=f"models:\n  - {{id: {GPT2}, task: text-generation, prompt: {prompt}}}\n")
    out = pytester.path / "out"
    result = pytester.runpytest_subprocess("--device=cpu", "--results-dir=out", "--reference-cache=none")
    assert_outcomes(result, out, passed=1)
    row = pd.read_parquet(out / "data").set_index("model_id").loc[GPT2]
    assert row.result == "PASS" and list(row.fallback_ops) == ["aten::embedding"]
    assert len(row.fallback_calls) >= 1 and all(c.startswith("aten::embedding(bfloat16[") for c in row.fallback_calls)
    assert row.fallback_note.startswith("recorded on an eager rerun"), row.fallback_note
    runs = out / "runs" / slug(GPT2) / "cpu"
    assert "'capture_fallbacks': ['aten::embedding']" in (runs / FOLDER / "run.py").read_text()
    assert row.fallback_reproducer == f"runs/{slug(GPT2)}/cpu/{REPRO_FOLDER}/run.py"
    # Run as a user runs it: its own folder, no pytest, no plugin, no model loaded.
    alone = subprocess.run(
        [sys.executable, "run.py", "--out", "result.json"],
        cwd=(out / row.fallback_reproducer).parent,
        env={k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert "aten::embedding(bfloat16[" in alone.stdout
    assert ": ran; the cpu device keeps no fallback list" in alone.stdout
    # Every call the row names is one the script makes.
    made = [line.split(": ran;")[0] for line in alone.stdout.splitlines() if ": ran;" in line]
    assert made == list(row.fallback_calls), (made, row.fallback_calls)
    # `neuron-support runscript --fallbacks` hands it out; `explain` tells it with the calls.
    cli = [sys.executable, "-m", "pytest_neuron_support.cli"]
    handed = subprocess.run(
        [*cli, "runscript", GPT2, f"--results-dir={out}", "--fallbacks"], capture_output=True, text=True, timeout=120
    )
    assert handed.returncode == 0 and handed.stdout == (out / row.fallback_reproducer).read_text(), handed.stderr
    told = subprocess.run([*cli, "explain", GPT2, f"--results-dir={out}"], capture_output=True, text=True, timeout=120)
    assert told.returncode == 0, told.stderr
    assert f"   fallback_calls: {', '.join(row.fallback_calls)}\n" in told.stdout, told.stdout
    assert f"the fallback reproducer ({row.fallback_note}): neuron-support runscript {GPT2}" in told.stdout


def run_py_helpers() -> dict[str, Any]:
    """run.py's own functions, as the rendered script defines them."""
    spec = {"device": DEVICES["neuron"].as_runscript_spec()}
    namespace: dict[str, Any] = {"__name__": "template"}
    exec(
        compile(with_spec(template("run.py", ("transformers.py", "text.py", "generation.py")), spec), "run.py", "exec"),
        namespace,
    )
    return namespace


def test_op_names_match_however_a_list_spells_them_and_arguments_are_recorded_as_a_spec_can_hold_them() -> None:
    import torch

    helpers = run_py_helpers()
    op_base = helpers["op_base"]
    for name in ("aten::add.Tensor", "aten.add.Tensor", "torch.ops.aten.add.Tensor", "add.Tensor", "add", "aten::add"):
        assert op_base(name) == "add", name
    assert op_base("torchvision::roi_align") == op_base("torchvision.roi_align") == "roi_align"
    described = helpers["described"]
    assert described(torch, float("-inf")) == {"float": "-inf"} and described(torch, 0.5) == 0.5
    assert described(torch, [torch.zeros(2, 3, dtype=torch.bfloat16), torch.float32]) == [
        {"tensor": "bfloat16", "shape": [2, 3], "on": "cpu"},
        {"dtype": "float32"},
    ]
    # Only a call with a tensor on the run's device is a fallback; a call on host tensors is the host's own work.
    on_the_device = helpers["on_the_device"]
    assert on_the_device(torch, [torch.zeros(1), 3], "cpu") and not on_the_device(torch, [torch.zeros(1)], "neuron")
    assert on_the_device(torch, [[torch.zeros(1, device="meta")]], "meta")


def test_a_ranks_part_of_a_module_output_is_matched_to_its_slice_of_the_cpus() -> None:
    held_slice = run_py_helpers()["held_slice"]
    assert held_slice((1, 5, 8), (1, 5, 8), 1, 2) is ...
    assert held_slice((1, 5, 8), (1, 5, 4), 1, 2) == (slice(None), slice(None), slice(4, 8))
    # Tensor parallelism's chunks of ceil(size / world): 7 over 2 ranks is 4 then 3.
    assert held_slice((1, 7), (1, 3), 1, 2) == (slice(None), slice(4, 7))
    assert held_slice((1, 7), (1, 4), 0, 2) == (slice(None), slice(0, 4))
    assert held_slice((1, 7), (1, 4), 1, 2) is None  # not what rank 1 holds
    assert held_slice((2, 8), (1, 4), 0, 2) is None  # two dimensions differ
    assert held_slice((8,), (1, 8), 0, 2) is None
