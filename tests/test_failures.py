"""`neuron-support failures` and the signatures section of `neuron-support diff`, as users run them
(real subprocesses on real Parquet files), and end to end: a tiny sweep with two planted faults."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from faultkit import catalog

from pytest_neuron_support.data.dataset import read_dataset, write_rows
from pytest_neuron_support.data.records import Row


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_neuron_support.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
        timeout=120,
    )


def listed(stdout: str) -> dict[str, list[str]]:
    """signature -> its models, as `failures` prints them (checking each count line against its models)."""
    found: dict[str, list[str]] = {}
    lines = stdout.splitlines()
    for i, line in enumerate(lines):
        match = re.fullmatch(r"(\d+) model\(s\)  (.+)", line)
        if match:
            models = lines[i + 1].removeprefix("  models: ").split(", ")
            assert len(models) == int(match.group(1)), lines[i : i + 2]
            assert lines[i + 2].startswith(f"  e.g. {models[0]}: "), lines[i + 2]
            found[match.group(2)] = models
    return found


SEGV = "run.py killed by SIGSEGV\nthe log tail of {model}"
OOM = "OutOfMemoryError: CUDA out of memory. Tried to allocate {gib}.00 GiB. GPU 0 has a total capacity of 79.15 GiB"


def err(model: str, error: str, stage: str = "load", version: str = "5.24.0", stamp: str = "01") -> Row:
    return Row(
        model_id=model,
        result="ERROR",
        failure_stage=stage,
        error=error,
        library_version=version,
        timestamp=f"2026-11-30T{stamp}:00:00+00:00",
    )


def test_failures_lists_signatures_by_the_models_they_block(tmp_path: Path) -> None:
    rows = [
        err("org/a", SEGV.format(model="org/a")),
        err("org/b", SEGV.format(model="org/b")),
        err("org/c", SEGV.format(model="org/c")),
        err("org/d", OOM.format(gib=2)),
        Row(model_id="org/e", result="PASS", library_version="5.24.0", timestamp="2026-11-30T01:00:00+00:00"),
        # An older stack: only --stack shows it.
        err("org/a", OOM.format(gib=8), version="5.23.0", stamp="00"),
    ]
    write_rows(tmp_path / "results", rows)
    done = cli("failures", cwd=tmp_path)  # --results-dir defaults to ./results
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("neuronxcc-none__transformers-5.24.0: 2 failure signature(s) block 4 of 5 model(s) ("), (
        lines[0]
    )
    assert lines[1] == "(the newest of 2 stacks; --stack picks another: neuronxcc-none__transformers-5.23.0)"
    assert listed(done.stdout) == {
        "load: run.py killed by SIGSEGV": ["org/a", "org/b", "org/c"],
        "load: OutOfMemory device: device memory exhausted": ["org/d"],
    }
    assert list(listed(done.stdout)) == [
        "load: run.py killed by SIGSEGV",
        "load: OutOfMemory device: device memory exhausted",
    ]
    # The example is the error as recorded (its head), not the normalised signature.
    assert "  e.g. org/a: run.py killed by SIGSEGV" in lines
    assert f"  e.g. org/d: {OOM.format(gib=2)}" in lines
    older = cli(
        "failures", "--results-dir", str(tmp_path / "results"), "--stack", "neuronxcc-none__transformers-5.23.0"
    )
    assert older.returncode == 0, older.stderr
    assert listed(older.stdout) == {"load: OutOfMemory device: device memory exhausted": ["org/a"]}


def test_failures_says_what_to_pass_for_a_missing_dataset_or_stack(tmp_path: Path) -> None:
    missing = cli("failures", "--results-dir", str(tmp_path / "nowhere"))
    assert missing.returncode == 2
    assert f"no dataset under {tmp_path / 'nowhere' / 'data'}" in missing.stderr
    assert "pass the --results-dir of a sweep" in missing.stderr
    write_rows(tmp_path / "results", [err("org/a", "MemoryError: ")])
    unknown = cli("failures", "--results-dir", str(tmp_path / "results"), "--stack", "neuronxcc-9__transformers-9")
    assert unknown.returncode == 2
    assert "no stack neuronxcc-9__transformers-9" in unknown.stderr
    assert "pass one of: neuronxcc-none__transformers-5.24.0" in unknown.stderr
    clean = tmp_path / "clean"
    write_rows(clean, [Row(model_id="org/a", result="PASS", library_version="5.24.0")])
    nothing = cli("failures", "--results-dir", str(clean))
    assert nothing.returncode == 0, nothing.stderr
    assert nothing.stdout.startswith(
        "neuronxcc-none__transformers-5.24.0: 0 failure signature(s) block 0 of 1 model(s)"
    )
    assert listed(nothing.stdout) == {}


def test_diff_lists_signatures_that_appeared_and_disappeared(tmp_path: Path) -> None:
    old = [err("org/a", SEGV.format(model="org/a")), err("org/b", SEGV.format(model="org/b")), err("org/c", "x: y")]
    new = [
        Row(model_id="org/a", result="PASS", library_version="5.24.0"),
        err("org/b", OOM.format(gib=2)),
        err("org/c", "x: y"),
        err("org/d", OOM.format(gib=4)),
    ]
    write_rows(tmp_path / "old", old)
    write_rows(tmp_path / "new", new)
    done = cli("diff", str(tmp_path / "old"), str(tmp_path / "new"))
    assert done.returncode == 0, done.stderr  # a newly failing model that was never PASS is no regression
    lines = done.stdout.splitlines()
    assert "appeared    2 model(s): load: OutOfMemory device: device memory exhausted" in lines
    assert "            org/b, org/d" in lines
    assert "disappeared 2 model(s): load: run.py killed by SIGSEGV" in lines
    assert "            org/a, org/b" in lines
    assert not any("x: y" in line for line in lines)  # persisting: only with -v
    assert lines[-2] == (
        "signatures: 1 appeared, 1 disappeared; 1 model(s) newly blocked, 1 model(s) unblocked, "
        "1 blocked by another signature now"
    )
    assert lines[-1] == "1 fixed, 1 new, 2 unchanged"  # the per-model counts stay last
    verbose = cli("diff", "-v", str(tmp_path / "old"), str(tmp_path / "new")).stdout.splitlines()
    assert "persisting  1 -> 1 model(s): load: x: y" in verbose


# --- end to end: two planted faults, each in two models -------------------------------------------

# Both raise right after the model loads (the post-load hook's code runs there in run.py), before
# anything compiles: cheap, and at stage load. Each message carries what differs between models
# (the model's id and run directory, a weight's shape, an address, a pid) so that grouping them
# takes the normalisation, not luck.
PLANTED = """
UNSUPPORTED_OP = (
    "import os\\n"
    "shape = tuple(next(model.parameters()).shape)\\n"
    "raise NotImplementedError(\\n"
    "    f\\"Could not run 'neuron::fused_rope' with arguments from the 'Neuron' backend: input of shape {shape} \\"\\n"
    "    f\\"for {SPEC['model']} at {hex(id(model))} in {os.getcwd()}\\"\\n"
    ")\\n"
)
MISSING_NEFF = (
    "import os\\n"
    "raise FileNotFoundError(2, 'No such file or directory', "
    "os.path.join(os.getcwd(), 'neff', f'graph_{os.getpid()}.neff'))\\n"
)
FAULTS = {
    "tiny-random/gpt2": UNSUPPORTED_OP,
    "tiny-random/qwen3": UNSUPPORTED_OP,
    "tiny-random/llama": MISSING_NEFF,
    "tiny-random/smollm3": MISSING_NEFF,
}


def pytest_neuron_support_post_load(config, model):
    return FAULTS.get(model.id)
"""

OP_SIGNATURE = (
    "load: NotImplementedError neuron::fused_rope: Could not run '<op>' with arguments from the 'Neuron' backend: "
    "input of shape <shape> for <model> at <addr> in <path>/device"
)
NEFF_SIGNATURE = "load: FileNotFoundError: [Errno 2] No such file or directory: '<path>/graph_<n>.neff'"


@pytest.mark.usefixtures("eager_compile")
@pytest.mark.usefixtures("shared_references")
@pytest.mark.slow
def test_a_sweep_with_two_planted_faults_prints_two_signatures_and_diff_sees_them_appear(
    pytester: pytest.Pytester, offline_hub: Path
) -> None:
    pytester.makeconftest(PLANTED)
    pytester.makefile(
        ".yaml", models=catalog("tiny-random/gpt2", "tiny-random/qwen3", "tiny-random/llama", "tiny-random/smollm3")
    )
    result = pytester.runpytest_subprocess("--device=cpu", "-n", "2", "--results-dir=out", "-q")
    result.assert_outcomes(failed=4)
    out = pytester.path / "out"
    df = pd.read_parquet(out / "data").set_index("model_id")
    assert set(df.result) == {"ERROR"} and set(df.failure_stage) == {"load"}, df[["result", "failure_stage", "error"]]
    # The raw errors differ in every model; their signatures do not.
    assert df.error.nunique() == 4
    assert df.signature.to_dict() == {
        "tiny-random/gpt2": OP_SIGNATURE,
        "tiny-random/qwen3": OP_SIGNATURE,
        "tiny-random/llama": NEFF_SIGNATURE,
        "tiny-random/smollm3": NEFF_SIGNATURE,
    }

    done = cli("failures", "--results-dir", "out", cwd=pytester.path)
    assert done.returncode == 0, done.stderr
    assert "2 failure signature(s) block 4 of 4 model(s)" in done.stdout.splitlines()[0]
    assert listed(done.stdout) == {
        OP_SIGNATURE: ["tiny-random/gpt2", "tiny-random/qwen3"],
        NEFF_SIGNATURE: ["tiny-random/llama", "tiny-random/smollm3"],
    }

    # The clean sweep of the same models, written with the dataset's own writer (no second sweep).
    clean = pytester.path / "clean"
    write_rows(
        clean,
        [
            replace(r, result="PASS", failure_stage=None, error=None, verdict_basis="parity+teacher-forced")
            for r in read_dataset(out)
        ],
    )
    assert pd.read_parquet(clean / "data").signature.isna().all()
    diff = cli("diff", str(clean), str(out))
    assert diff.returncode == 1, diff.stdout + diff.stderr  # four regressions
    lines = diff.stdout.splitlines()
    assert f"appeared    2 model(s): {NEFF_SIGNATURE}" in lines
    assert f"appeared    2 model(s): {OP_SIGNATURE}" in lines
    assert "            tiny-random/gpt2, tiny-random/qwen3" in lines
    assert "            tiny-random/llama, tiny-random/smollm3" in lines
    assert lines[-2] == "signatures: 2 appeared, 0 disappeared; 4 model(s) newly blocked, 0 model(s) unblocked"
    assert lines[-1] == "4 regressed"
    fixed = cli("diff", str(out), str(clean))
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert fixed.stdout.splitlines()[-2] == (
        "signatures: 0 appeared, 2 disappeared; 0 model(s) newly blocked, 4 model(s) unblocked"
    )
