"""The first diverging module of a numerics FAIL: the pure search over module scores, the signature and the
assertion message that name it, and, end to end as users run the plugin, faults planted on the device only in
one layer's MLP of the tiny text model and in a forward task's head, each named exactly; a clean model's PASS
runs no search at all."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from faultkit import assert_outcomes, planted_conftest, planted_hub

from pytest_neuron_support import zoo
from pytest_neuron_support.base.storage import slug
from pytest_neuron_support.cpu.locate import CPU_FOLDER, DEVICE_FOLDER, MODULE_FOLDER
from pytest_neuron_support.data.records import Row
from pytest_neuron_support.data.signatures import MODULE_SEARCH
from pytest_neuron_support.verdict.modules import first_diverging, row_fields
from pytest_neuron_support.verdict.tolerance import FLOOR, MULTIPLE


def score(module: str, distance: float, noise: float = 0.004, kind: str = "Linear") -> dict[str, object]:
    return {"module": module, "kind": kind, "distance": distance, "noise": noise}


def test_the_first_module_out_of_tolerance_is_named_with_the_last_one_inside() -> None:
    scores = [
        score("model.embed_tokens", 0.0, 0.0, "Embedding"),
        score("model.layers.0.mlp", 0.01),  # 2.5x its noise: inside
        score("model.layers.1.mlp.down_proj", 0.5),  # 125x: out
        score("model.layers.1.mlp", 0.5, kind="Qwen3MLP"),  # out too, but after
    ]
    found = first_diverging(scores)
    assert found.first is not None and found.first.stage == "model.layers.1.mlp.down_proj"
    assert found.kind == "Linear" and found.last_inside == "model.layers.0.mlp" and found.compared == 4
    assert math.isclose(found.first.ratio, 125.0)
    words = found.describe()
    assert words.startswith(MODULE_SEARCH.lstrip("; ")), words  # the signature cuts the error where this starts
    fields = row_fields(found)
    assert fields["diverging_module"] == "model.layers.1.mlp.down_proj" and fields["diverging_ratio"] == 125.0
    assert fields["last_inside_module"] == "model.layers.0.mlp" and fields["locate_note"].startswith("located: 4")


def test_the_rule_is_the_calibrated_one_at_its_edge() -> None:
    # A float32 module's noise is zero: its floor is FLOOR, so MULTIPLE x FLOOR is inside and a hair over is out.
    assert first_diverging([score("a", MULTIPLE * FLOOR, 0.0)]).first is None
    assert first_diverging([score("a", MULTIPLE * FLOOR * 1.01, 0.0)]).first is not None
    # A NaN on the device never passes, and the very first module out has nothing inside before it.
    nan = first_diverging([score("a", math.nan), score("b", 0.0)])
    assert nan.first is not None and nan.first.stage == "a" and nan.last_inside is None


def test_nothing_named_says_why() -> None:
    inside = first_diverging([score("a", 0.001), score("b", 0.002)])
    assert inside.first is None and "every one of 2 module outputs was inside" in inside.describe()
    assert row_fields(inside)["diverging_module"] is None and "inside" in row_fields(inside)["locate_note"]
    nothing = first_diverging([], unpaired=["model.x: on the device only", "model.y: not recorded on the device"])
    assert nothing.first is None and nothing.problem is not None and "model.x: on the device only" in nothing.problem


def test_a_sharded_search_says_which_rank_was_out_and_counts_what_it_could_not_compare() -> None:
    scores = [
        {**score("model.layers.0.self_attn.q_proj", 0.004), "rank": 0, "held": "its chunk 1/2 of dim 2"},
        {**score("model.layers.1.mlp.down_proj", 2.0), "rank": 1, "held": "the whole output"},
    ]
    why = "model.layers.0.self_attn.rotary: rank 1 holds shape [1, 4], the CPU [1, 6]: no slice of it matches"
    found = first_diverging(scores, unpaired=[why])
    assert found.first is not None and found.first.stage == "model.layers.1.mlp.down_proj"
    assert found.held == "rank 1, the whole output" and found.uncompared == (why,)
    assert "model.layers.1.mlp.down_proj (Linear) on rank 1, the whole output: relative" in found.describe()
    note = row_fields(found)["locate_note"]
    assert note.startswith("located: 2 module outputs compared (out on rank 1, the whole output), 1 not compared")
    assert why in note


def test_the_signature_names_the_module_and_keeps_the_cause() -> None:
    error = "the device's tokens are not the CPU model's top-1 under the device's own prefix (teacher-forced CPU check)"
    plain = Row(model_id="org/a", result="FAIL", failure_stage="parity", error=error, first_disagreement=0)
    located = Row(
        model_id="org/b",
        result="FAIL",
        failure_stage="parity",
        error=f"{error}{MODULE_SEARCH}model.layers.1.mlp.down_proj (Linear): relative distance 0.5",
        first_disagreement=0,
        diverging_module="model.layers.1.mlp.down_proj",
        diverging_module_kind="Linear",
    )
    assert plain.signature == "parity: teacher-forced disagreement at token 0"
    assert located.signature == f"parity: model.layers.1.mlp.down_proj (Linear) diverges first; {plain.signature[8:]}"


QWEN = "tiny-random/qwen3"
CLASSIFIER = "tiny-random/distilbert-sst2"
MISTRAL = "tiny-random/mistral"
MLP = "planted/qwen3-mlp"
HEAD = "planted/distilbert-head"
#: A fault on one rank of a model run on 2 cores (tensor parallel): rank 1's half of layer 1's column-parallel gate
#: projection negated, which only a rank-by-rank search against the CPU's matching chunk can name.
SHARDED = "planted/mistral-mlp"
SHARDED_FAULT = (
    "if torch.distributed.get_rank() == 1:\n"
    "    with torch.no_grad():\n"
    "        model.model.layers[1].mlp.gate_proj.weight.mul_(-1.0)\n"
)
#: The planted faults, on the device only: the last layer's MLP output projection, and the classifier head, negated.
MLP_FAULT = "model.model.layers[1].mlp.down_proj.weight.mul_(-1.0)"
HEAD_FAULT = "model.classifier.weight.mul_(-1.0)"


@pytest.fixture
def planted(offline_hub: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = planted_hub(offline_hub, tmp_path, monkeypatch, QWEN, MLP)
    for repo, planted_id in ((CLASSIFIER, HEAD), (MISTRAL, SHARDED)):
        snapshot = next((cache / f"models--{repo.replace('/', '--')}" / "snapshots").iterdir())
        zoo.install_snapshot(cache, planted_id, snapshot)
    return cache


@pytest.mark.usefixtures("eager_compile", "planted")
@pytest.mark.slow
def test_planted_faults_are_named_exactly_and_a_pass_runs_no_search(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        planted_conftest(
            {
                MLP: f"with torch.no_grad():\n    {MLP_FAULT}\n",
                HEAD: f"with torch.no_grad():\n    {HEAD_FAULT}\n",
                SHARDED: SHARDED_FAULT,
            }
        )
    )
    prompt = repr(zoo.TINY_PROMPT)
    pytester.makefile(
        ".yaml",
        models=(
            "models:\n"
            f"  - {{id: {QWEN}, task: text-generation, prompt: {prompt}}}\n"
            f"  - {{id: {MLP}, task: text-generation, prompt: {prompt}}}\n"
            f"  - {{id: {HEAD}, task: text-classification}}\n"
            f"  - {{id: {SHARDED}, task: text-generation, cores: 2, prompt: {prompt}}}\n"
        ),
    )
    out = pytester.path / "out"
    result = pytester.runpytest_subprocess("--device=cpu", "-n", "2", "--results-dir=out", "--reference-cache=none")
    assert_outcomes(result, out, passed=1, failed=3)
    df = pd.read_parquet(out / "data").set_index("model_id")

    clean = df.loc[QWEN]
    assert clean.result == "PASS" and pd.isna(clean.diverging_module) and pd.isna(clean.locate_note)
    clean_runs = out / "runs" / slug(QWEN) / "cpu"  # the check's folder, named by the device
    assert (clean_runs / "device").is_dir() and not (clean_runs / DEVICE_FOLDER).exists()  # a PASS costs nothing

    mlp = df.loc[MLP]
    assert (mlp.result, mlp.failure_stage) == ("FAIL", "parity"), mlp.error
    assert mlp.diverging_module == "model.layers.1.mlp.down_proj", mlp.locate_note
    assert mlp.diverging_module_kind == "Linear" and mlp.last_inside_module == "model.layers.1.mlp.up_proj"
    assert mlp.diverging_ratio > MULTIPLE and mlp.locate_note.startswith("located: ")
    assert f"{MODULE_SEARCH}model.layers.1.mlp.down_proj (Linear)" in mlp.error
    assert mlp.signature.startswith("parity: model.layers.1.mlp.down_proj (Linear) diverges first; ")
    # One forward on each side, in folders of their own beside the check's.
    runs = out / "runs" / slug(MLP) / "cpu"
    assert (runs / DEVICE_FOLDER / "trace.pt").exists() and MLP_FAULT in (runs / DEVICE_FOLDER / "run.py").read_text()
    assert MLP_FAULT not in (runs / CPU_FOLDER / "run.py").read_text()

    # The module alone: its standalone reproducer, run as a user runs it (no pytest, no plugin), prints the
    # device's ratio over the tolerance.
    assert mlp.reproducer == f"runs/{slug(MLP)}/cpu/{MODULE_FOLDER}/run.py", mlp.reproducer_note
    alone = subprocess.run(
        [sys.executable, "run.py", "--out", "result.json"],
        cwd=out / Path(mlp.reproducer).parent,
        env={k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    said = "model.layers.1.mlp.down_proj (Linear) alone on its recorded inputs: the device's relative distance from"
    assert said in alone.stdout, alone.stdout + alone.stderr[-3000:]
    assert "(OUT OF tolerance, at most 3x)" in alone.stdout
    reproduced = json.loads((out / Path(mlp.reproducer).parent / "result.json").read_text())
    assert (
        reproduced["ok"] and reproduced["ratio"] > MULTIPLE and reproduced["module"] == "model.layers.1.mlp.down_proj"
    )

    head = df.loc[HEAD]
    assert (head.result, head.failure_stage) == ("FAIL", "parity"), head.error
    assert head.diverging_module == "classifier" and head.diverging_module_kind == "Linear", head.locate_note
    assert head.last_inside_module == "dropout" and head.signature.startswith("parity: classifier (Linear)")

    # On 2 cores each rank's part of every module's output was compared with the CPU's slice it holds (a
    # column-parallel projection's chunk, the whole output after a row-parallel one's all-reduce): the fault on
    # rank 1 alone is named, with the rank and the chunk; no single-module reproducer is written for it, and the
    # row says why.
    sharded = df.loc[SHARDED]
    assert (sharded.result, sharded.failure_stage, sharded.neuron_cores) == ("FAIL", "parity", 2), sharded.error
    assert sharded.diverging_module == "model.layers.1.mlp.gate_proj", sharded.locate_note
    assert sharded.last_inside_module == "model.layers.1.post_attention_layernorm", sharded.locate_note
    assert sharded.diverging_ratio > MULTIPLE and "(out on rank 1, its chunk 2/2 of dim 2)" in sharded.locate_note
    assert sharded.signature.startswith("parity: model.layers.1.mlp.gate_proj (Linear) diverges first; ")
    sharded_runs = out / "runs" / slug(SHARDED) / "cpu"
    scored = json.loads((sharded_runs / CPU_FOLDER / "result.json").read_text())["modules"]
    held = {m["module"]: m["held"] for m in scored}
    assert held["model.layers.0.self_attn.q_proj"].endswith("/2 of dim 2"), held  # a rank's own chunk
    assert held["model.layers.0.self_attn.o_proj"] == "the whole output", held
    assert {(sharded_runs / DEVICE_FOLDER / f"trace.rank{rank}.pt").is_file() for rank in (0, 1)} == {True}
    assert pd.isna(sharded.reproducer) and sharded.reproducer_note.startswith("not written: on 2 cores")

    # The failed assert says it, as pytest prints it.
    text = result.stdout.str()
    assert "first diverging module: model.layers.1.mlp.down_proj (Linear), distance " in text
    assert "first diverging module: classifier (Linear)" in text

    # The whole story of each row, as `neuron-support explain` prints it: in order, ending with how to rerun it.
    told = explain(out, MLP)
    order = ["1. plan", "2. stages", "3. evidence", "4. FAIL at stage parity", "5. first diverging module"]
    order += ["6. failure signature", "7. expectation", "8. reproduce it"]
    assert [told.index(heading) for heading in order] == sorted(told.index(heading) for heading in order), told
    assert "   model.layers.1.mlp.down_proj (Linear): relative distance from float32 " in told
    assert f"   {mlp.signature}\n   shared by 0 other model(s) of this stack" in told
    assert f"neuron-support runscript {MLP} --stack " in told and "python3 run.py --out result.json" in told
    passed = explain(out, QWEN)
    assert "4. PASS" in passed and "not searched: the search runs only after a numerics FAIL" in passed
    assert "none: a PASS row blocks nothing" in passed
    none = run_cli("runscript", QWEN, f"--results-dir={out}", "--reproducer")
    assert (
        none.returncode == 1
        and "no reproducer for tiny-random/qwen3: only a compile ERROR or a numerics" in none.stderr
    )
    missing = explain(out, "org/never-ran", status=2)
    assert missing.startswith("neuron-support explain: no row for org/never-ran under "), missing


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``neuron-support ARGS`` in a process of its own, as a user runs it."""
    command = [sys.executable, "-m", "pytest_neuron_support.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)


def explain(results: Path, model: str, status: int = 0) -> str:
    """``neuron-support explain MODEL`` in a process of its own, as a user runs it: its stdout, or its stderr where
    it exits with the ``status`` given."""
    done = run_cli("explain", model, f"--results-dir={results}")
    assert done.returncode == status, done.stderr
    return done.stdout if status == 0 else done.stderr


#: A stand-in for a device compiler installed beside torch, as torch-neuronx registers ``neuron``: a Dynamo backend
#: found through the ``torch_dynamo_backends`` entry point, that rejects every graph holding a SiLU with an
#: neuronx-cc-style error code. It is planted in the compiler itself, so a fresh process that compiles the same
#: graph with it fails the same way.
FAULTY_BACKEND = '''"""A Dynamo backend that rejects any graph holding a SiLU, as a compiler rejects an operation."""


class CompilerError(RuntimeError):
    pass


def compile(gm, example_inputs):
    for node in gm.graph.nodes:
        if "silu" in str(node.target):
            raise CompilerError("NCC_IXTP002: the compiler cannot lower silu (planted)")
    return gm.forward
'''

#: Runs a reproducer as its user does, then says how it ended and whether pytest or the plugin got imported.
RUN_REPRO = """
import runpy, sys
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
    print("ENDED: no error")
except BaseException as exc:
    print("ENDED:", type(exc).__name__, " ".join(str(exc).split()))
print("IMPORTED:", sorted(m for m in sys.modules if m.split(".")[0] in ("pytest", "_pytest", "pytest_neuron_support")))
"""


def install_backend(where: Path) -> None:
    """The planted backend as an installed distribution (its module and its entry point) under ``where``."""
    (where / "faultybackend-0.1.dist-info").mkdir(parents=True)
    (where / "faultybackend.py").write_text(FAULTY_BACKEND)
    (where / "faultybackend-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: faultybackend\n")
    entry = "[torch_dynamo_backends]\nfaulty = faultybackend:compile\n"
    (where / "faultybackend-0.1.dist-info" / "entry_points.txt").write_text(entry)


@pytest.mark.usefixtures("offline_hub")
@pytest.mark.slow
def test_a_planted_compile_failure_is_reproduced_standalone(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = tmp_path / "backend"
    install_backend(backend)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(backend), os.environ.get("PYTHONPATH")) if p))
    pytester.makefile(".yaml", models=f"models:\n  - {{id: {QWEN}, task: text-generation}}\n")
    out = pytester.path / "out"
    result = pytester.runpytest_subprocess(
        "--device=cpu", "--results-dir=out", "--reference-cache=none", "--compile-backend=faulty"
    )
    assert_outcomes(result, out, failed=1)
    row = pd.read_parquet(out / "data").set_index("model_id").loc[QWEN]
    assert (row.result, row.failure_stage, row.compiler_error_code) == ("ERROR", "compile", "NCC_IXTP002"), row.error
    assert row.signature.startswith("compile: BackendCompilerFailed NCC_IXTP002: "), row.signature
    assert row.reproducer == f"runs/{slug(QWEN)}/cpu/compile-repro/repro.py", row.reproducer_note
    assert row.reproducer_note.startswith("captured by Dynamo's repro_after='dynamo' on a rerun")

    # The command hands it out, and the row's story says where it is and what the compiler said.
    handed = subprocess.run(
        [sys.executable, "-m", "pytest_neuron_support.cli", "runscript", QWEN, "--results-dir=out", "--reproducer"],
        cwd=pytester.path,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert handed.stdout == (out / row.reproducer).read_text()
    told = explain(out, QWEN)
    assert "   the compiler's error code: NCC_IXTP002" in told
    assert f"neuron-support runscript {QWEN} --stack " in told and " --reproducer > repro.py" in told

    # The reproducer alone, in a fresh process with nothing but the backend installed beside torch: it fails as the
    # run did, on the inputs it recorded (its checkpoints/ folder) and, from a folder holding the script alone, on
    # random inputs (no weights); neither pytest nor the plugin is imported.
    recorded, alone = tmp_path / "recorded", tmp_path / "alone"
    shutil.copytree((out / row.reproducer).parent, recorded)
    alone.mkdir()
    shutil.copy(out / row.reproducer, alone / "repro.py")
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(backend), "HOME": str(tmp_path)}
    for folder, args in ((recorded, []), (alone, ["run", "--no-save-dir"])):
        done = subprocess.run(
            [sys.executable, "-c", RUN_REPRO, "repro.py", *args],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        ended = next((line for line in done.stdout.splitlines() if line.startswith("ENDED:")), done.stderr[-2000:])
        assert ended.startswith("ENDED: BackendCompilerFailed "), ended
        assert "CompilerError: NCC_IXTP002: the compiler cannot lower" in ended, ended
        assert "IMPORTED: []" in done.stdout, done.stdout


def test_only_the_backends_own_compile_failure_is_rerun_for_a_reproducer() -> None:
    """A compile ERROR that is not the backend failing on a graph (a pipeline's post-processing reported at compile,
    Dynamo's own tracing, a run that compiled nothing) has no graph for Dynamo to write: it is not rerun."""
    from typing import Any, cast

    from pytest_neuron_support.devices.table import DEVICES
    from pytest_neuron_support.run.repro import capture_compile_failure
    from pytest_neuron_support.run.runscript import RunSpec

    class NoLease:
        """A job with no lease to rerun on, that counts the reruns asked of it."""

        sharded = False
        reruns = 0

        def rerun_on_device(self, spec: RunSpec, folder: str) -> None:
            assert spec.capture_compile_failure and folder == "compile-repro"
            self.reruns += 1

    stub = NoLease()
    job = cast(Any, stub)
    spec = RunSpec(
        model="org/m",
        revision="main",
        task="text-generation",
        dtype="bfloat16",
        prompt="",
        max_new_tokens=1,
        device=DEVICES["cpu"],
        compile=True,
        compile_backend="inductor",
    )
    found = capture_compile_failure(job, spec, "TypeError: Got unsupported ScalarType BFloat16")
    assert found.script is None and stub.reruns == 0
    assert found.note == (
        "not captured: TypeError is not the backend failing on a graph (BackendCompilerFailed), not rerun"
    )
    # The backend's own failure gets past that guard (here to the missing lease, which a session always has).
    found = capture_compile_failure(job, spec, "BackendCompilerFailed: backend='neuron' raised: CompilationError")
    assert found.note == "not captured: no lease to run the device again on" and stub.reruns == 1
