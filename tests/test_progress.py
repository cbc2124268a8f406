"""Live progress of a sweep as a user watches it: a line when each model starts and ends, periodic
status lines with the running models' stage, and ``neuron-support status`` from another shell while
the sweep runs (what runs, at which stage, which cores are leased to whom); ``-q`` silences the lines."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from faultkit import catalog

from pytest_neuron_support.session.progress import State, duration, status_lines

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("eager_compile")]


def _status(cwd: Path, results: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pytest_neuron_support.cli", "status", "--results-dir", results]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=60)


@pytest.mark.usefixtures("shared_references")
def test_progress_lines_and_status_from_another_shell(pytester: pytest.Pytester, offline_hub: Path) -> None:
    pytester.makefile(".yaml", models=catalog("tiny-random/qwen3", "tiny-random/gpt2"))
    args = ["--device=cpu", "-n", "2", "--neuron-cores=1", "--results-dir=out", "--progress-interval=2"]
    sweep = subprocess.Popen(
        [sys.executable, "-m", "pytest", *args, "-p", "no:cacheprovider"],
        cwd=pytester.path,
        env=os.environ.copy(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen: list[str] = []
    try:
        # From another shell, while the sweep runs: a model running at a stage, on a leased core.
        deadline = time.monotonic() + 300
        while sweep.poll() is None and time.monotonic() < deadline:
            out = _status(pytester.path, "out").stdout
            if "is running" in out and "cores 0: models.yaml::test_model[" in out:
                stages = [line for line in out.splitlines() if line.startswith("  tiny-random/")]
                if any(f", {stage}, " in line for line in stages for stage in ("load", "compile", "generate")):
                    seen = out.splitlines()
                    break
            time.sleep(0.5)
        output, _ = sweep.communicate(timeout=600)
    finally:
        if sweep.poll() is None:
            sweep.kill()
    assert sweep.returncode == 0, output
    assert seen, "neuron-support status never showed a model running at a device stage"
    assert seen[0].startswith("the sweep in out is running (controller pid "), seen
    assert any(line.startswith("1 running, ") or line.startswith("2 running, ") for line in seen), seen
    assert any(line.startswith("leases on this host (cpu, ledger ") for line in seen), seen

    lines = output.splitlines()
    for model in ("tiny-random/qwen3", "tiny-random/gpt2"):
        assert any(line.startswith(f"[neuron-support] start {model}: 1 core(s), expected ") for line in lines), output
        assert any(line.startswith(f"[neuron-support] end   {model}: PASS in ") for line in lines), output
    assert not [line for line in lines if "[neuron-support]" in line and not line.startswith("[neuron-support]")]
    assert any(" running, " in line and " waiting of 2" in line for line in lines), output
    # After the sweep: finished, nothing running.
    after = _status(pytester.path, "out").stdout.splitlines()
    assert after[0].startswith("the sweep in out finished "), after
    assert after[1].startswith("0 running, 2 done, 0 waiting of 2") and "(2 PASS)" in after[1], after


@pytest.mark.usefixtures("shared_references")
def test_quiet_sweeps_print_no_progress(pytester: pytest.Pytester, offline_hub: Path) -> None:
    pytester.makefile(".yaml", models=catalog("tiny-random/gpt2"))
    result = pytester.runpytest_subprocess("--device=cpu", "--results-dir=out", "--progress-interval=1", "-q")
    result.assert_outcomes(passed=1)
    assert "[neuron-support]" not in result.stdout.str()
    assert (pytester.path / "out" / "status.json").exists()  # `neuron-support status` works either way


def test_status_lines_say_what_is_left() -> None:
    state = State(pid=1, device="neuron", pool=16, ledger="", started=0.0, total=5, done=2, results={"PASS": 2})
    assert status_lines(state, Path("/nonexistent"), now=100.0) == ["0 running, 2 done, 3 waiting of 5 (2 PASS)"]
    state.left_s = 3725.0
    assert status_lines(state, Path("/nonexistent"), now=100.0)[0].endswith(
        "; about 1h02m left (from expected costs) (2 PASS)"
    )
    assert [duration(s) for s in (0, 59.6, 61, 3600)] == ["0s", "1m00s", "1m01s", "1h00m"]


def test_status_without_a_sweep_says_what_to_pass(tmp_path: Path) -> None:
    done = _status(tmp_path, "nowhere")
    assert done.returncode == 1
    assert "no sweep has written nowhere/status.json; pass the --results-dir of a running sweep" in done.stderr
