"""Expected status (a catalog entry's ``expect:``): a known failure is an XFAIL with its reason, the same
model passing is a failed XPASS(strict), any other failure fails, and ``neuron-support expect update``
writes a sweep's outcomes back into the catalog, keeping the reasons already there."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from faultkit import assert_outcomes

from pytest_neuron_support.base.model import Expectation
from pytest_neuron_support.catalog.expectations import Change, apply_changes
from pytest_neuron_support.catalog.load import CatalogError, parse_catalog
from pytest_neuron_support.data.dataset import write_rows
from pytest_neuron_support.data.records import STAGES, Row
from pytest_neuron_support.verdict import expected

LLAMA, QWEN2, QWEN3 = "tiny-random/llama", "tiny-random/qwen2", "tiny-random/qwen3"
ISSUE = "https://example.org/upstream/issues/7"
#: The planted fault: the final norm negated on the device run only, a FAIL at parity.
PLANT = """
import os

def pytest_neuron_support_post_load(config, model):
    if os.environ.get("PLANT") == "1" and model.id in ("tiny-random/llama", "tiny-random/qwen2"):
        return "with torch.no_grad():\\n    model.model.norm.weight.mul_(-1.0)\\n"
    return None
"""
CATALOG = f"""# The expectation test's catalog: comments and order must survive expect update.
models:
  - id: {LLAMA}
    task: text-generation
    tags: [llama]
    # A known failure, with its upstream issue.
    expect: {{result: FAIL, stage: parity, reason: "{ISSUE}"}}
  - id: {QWEN2}
    task: text-generation
    expect:
      result: ERROR
      stage: load
      reason: believed to fail loading
  - id: {QWEN3}
    task: text-generation
    expect: {{result: PASS, recompiles: true, reason: believed to recompile}}
"""


def test_an_outcome_meets_improves_on_or_differs_from_its_expectation() -> None:
    fail = Expectation(result="FAIL", reason="r", stage="parity", signature="parity: teacher-forced")
    assert expected.compare(fail, "FAIL", "parity", "parity: teacher-forced disagreement at token 0", False) == "met"
    assert expected.compare(fail, "PASS", None, None, False) == "improved"
    assert expected.compare(fail, "FAIL", "generate", "generate: …", False) == "differs"  # another stage
    assert expected.compare(fail, "FAIL", "parity", "parity: free-running only", False) == "differs"  # signature
    assert expected.compare(fail, "ERROR", "parity", None, False) == "differs"  # another result
    assert expected.compare(fail, "SKIPPED", "plan", None, False) is None  # ran nothing: not compared
    recompiles = Expectation(result="PASS", reason="r", recompiles=True)
    assert expected.compare(recompiles, "PASS", None, None, True) == "met"
    assert expected.compare(recompiles, "PASS", None, None, False) == "improved"
    assert expected.compare(recompiles, "FAIL", "parity", None, True) == "differs"
    anywhere = Expectation(result="TIMEOUT", reason="r")
    assert expected.compare(anywhere, "TIMEOUT", "compile", "compile: timed out", False) == "met"
    said = expected.message(fail, "improved", "PASS", None, None)
    assert said.startswith("unexpected improvement: expected FAIL at parity, signature 'parity: teacher-forced'…")
    assert "neuron-support expect update" in said


@pytest.mark.parametrize(
    ("expect", "error"),
    [
        ("{result: BROKEN, reason: r}", "field 'expect': unknown expected result (got 'BROKEN')"),
        ("{result: FAIL}", "field 'expect': an expectation needs its reason; add 'reason:'"),
        ("{result: FAIL, reason: r, stage: nowhere}", "field 'expect': unknown stage (got 'nowhere')"),
        ("{result: FAIL, reason: r, check: train}", "names a check this entry does not make (got 'train')"),
        ("{result: PASS, reason: r}", "an expected PASS with nothing known about it is no expectation"),
        ("{result: PASS, recompiles: true, stage: parity, reason: r}", "a PASS has no failure stage or signature"),
        ("{result: FAIL, reason: r, why: x}", "unknown key 'why' under expect"),
        ("FAIL", "field 'expect': must be a mapping (got 'FAIL')"),
        # Without a stage or signature any failure of that result would count as the known one.
        ("{result: FAIL, reason: r}", "an expected FAIL must name the stage it fails at or the start of its"),
        ("{result: ERROR, reason: r}", "an expected ERROR must name the stage it fails at or the start of its"),
        ("{result: TIMEOUT, reason: r}", "an expected TIMEOUT must name the stage"),
    ],
)
def test_a_bad_expectation_is_one_error_naming_the_file_line_field_and_fix(expect: str, error: str) -> None:
    text = f"models:\n  - id: org/a\n    task: text-generation\n    expect: {expect}\n"
    with pytest.raises(CatalogError) as raised:
        parse_catalog(text, "m.yaml")
    assert str(raised.value).startswith("m.yaml:4: entry 'org/a': ") and error in str(raised.value)
    if "must name the stage" in error:
        assert str(raised.value).endswith(
            "add 'stage:' (one of " + ", ".join(STAGES) + ") or 'signature:' (neuron-support failures lists them), "
            "as the failing row's failure_stage and signature say"
        )
        # Either one is enough.
        for named in ("stage: load", "signature: 'load: OSError'"):
            parse_catalog(text.replace("reason: r", f"reason: r, {named}"), "m.yaml")


def test_expect_update_edits_only_the_expect_lines_of_the_entries_that_change() -> None:
    # qwen2's block-style expectation ends where the next entry begins: dropping it must not take qwen3's
    # "- id:" line with it; llama's comment and flow line stay; qwen3's gets replaced in place.
    recompiles = Expectation(result="PASS", reason="believed to recompile", recompiles=True)
    text = apply_changes(
        CATALOG, [Change(QWEN2, None, None), Change(QWEN3, None, replace(recompiles, reason="#44609"))]
    )
    assert [m.id for m in parse_catalog(text, "m.yaml").models] == [LLAMA, QWEN2, QWEN3]
    assert text.startswith(CATALOG[: CATALOG.index(f"  - id: {QWEN2}")])
    assert text.endswith(
        f"  - id: {QWEN2}\n    task: text-generation\n  - id: {QWEN3}\n    task: text-generation\n"
        '    expect: {result: "PASS", recompiles: true, reason: "#44609"}\n'
    )


def update(pytester: pytest.Pytester, results: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest_neuron_support.cli",
            "expect",
            "update",
            results,
            "--models-file=models.yaml",
            *args,
        ],
        cwd=pytester.path,
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.usefixtures("offline_hub", "eager_compile")
@pytest.mark.slow
def test_a_known_failure_is_an_xfail_a_fix_is_a_failed_xpass_and_expect_update_writes_the_catalog(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makeconftest(PLANT)
    catalog = pytester.makefile(".yaml", models=CATALOG)
    monkeypatch.setenv("PLANT", "1")
    planted = pytester.runpytest_subprocess("--device=cpu", "-n", "2", "--results-dir=planted", "-rxX")
    # llama fails as expected: an XFAIL with its reason. qwen2 fails otherwise than expected, and qwen3
    # passes without the recompile it was expected to have: two failures.
    assert_outcomes(planted, pytester.path / "planted", xfailed=1, failed=2)
    planted.stdout.fnmatch_lines([f"XFAIL models.yaml::test_model[[]{LLAMA}[]] - expected FAIL at parity: {ISSUE}"])
    out = planted.stdout.str()
    assert "expected ERROR at load (believed to fail loading), got FAIL at parity" in out
    assert "unexpected improvement: expected PASS with Dynamo's recompile limit hit (believed to recompile)" in out
    rows = pd.read_parquet(pytester.path / "planted" / "data").set_index("model_id")
    # Every row keeps its real result, and says how it compares with its expectation and why it was expected.
    assert list(rows.loc[[LLAMA, QWEN2, QWEN3], "result"]) == ["FAIL", "FAIL", "PASS"]
    assert list(rows.loc[[LLAMA, QWEN2, QWEN3], "expectation"]) == ["met", "differs", "improved"]
    assert rows.loc[LLAMA, "expected_reason"] == ISSUE and rows.loc[LLAMA, "expected_stage"] == "parity"

    # The fault fixed: llama passes where it was expected to fail, a failed XPASS(strict).
    monkeypatch.setenv("PLANT", "0")
    fixed = pytester.runpytest_subprocess("--device=cpu", "-n", "2", "--results-dir=fixed", "-rxX", "-k", "llama")
    assert_outcomes(fixed, pytester.path / "fixed", failed=1)
    fixed.stdout.fnmatch_lines([f"*XPASS(strict)*expected FAIL at parity: {ISSUE}*"])
    again = pd.read_parquet(pytester.path / "fixed" / "data").set_index("model_id").loc[LLAMA]
    assert (again.result, again.expectation) == ("PASS", "improved")

    # The planted sweep written back: llama's signature added and its reason kept, qwen3's dropped (it passed
    # clean); comments stay. qwen2's planted fault is a changed failure: refused, its expectation as it was,
    # and the command says why (and fails).
    done = update(pytester, "planted")
    assert done.returncode == 1, done.stderr
    assert "models.yaml: 2 expectation(s) changed" in done.stdout
    assert f"{QWEN2}: not written: a changed failure: expected ERROR at load, got FAIL at parity" in done.stderr
    kept = {m.id: m.expect for m in parse_catalog(catalog.read_text(), "models.yaml").models}[QWEN2]
    assert kept == Expectation(result="ERROR", reason="believed to fail loading", stage="load")
    # Accepted on the command line with its reason: written, with that reason.
    accepted = update(pytester, "planted", "--accept", QWEN2, "--reason", "https://example.org/issues/8")
    assert accepted.returncode == 0, accepted.stderr
    assert f"{QWEN3}: expectation dropped (was PASS with Dynamo's recompile limit hit): it passed" in done.stdout
    text = catalog.read_text()
    assert (
        text.startswith("# The expectation test's catalog")
        and "    # A known failure, with its upstream issue.\n" in text
    )
    written = {m.id: m.expect for m in parse_catalog(text, "models.yaml").models}
    signature = rows.loc[LLAMA, "signature"]
    assert written[LLAMA] == Expectation(result="FAIL", reason=ISSUE, stage="parity", signature=signature)
    assert written[QWEN2] == Expectation(
        result="FAIL", reason="https://example.org/issues/8", stage="parity", signature=rows.loc[QWEN2, "signature"]
    )
    assert written[QWEN3] is None
    # The sweep after the fix, written back: llama's expectation goes; the planted rows of qwen2 are older
    # than nothing in "fixed", so it keeps the one just written.
    done = update(pytester, "fixed")
    assert done.returncode == 0 and f"{LLAMA}: expectation dropped" in done.stdout, done.stdout + done.stderr
    after = {m.id: m.expect for m in parse_catalog(catalog.read_text(), "models.yaml").models}
    assert after[LLAMA] is None and after[QWEN2] == written[QWEN2]
    # With the catalog written back, the planted sweep passes: llama and qwen2 XFAIL, qwen3 passes.
    monkeypatch.setenv("PLANT", "1")
    # llama's expectation was dropped by the fixed sweep: restore the planted one to see both XFAIL.
    assert update(pytester, "planted").returncode == 0
    rerun = pytester.runpytest_subprocess("--device=cpu", "-n", "2", "--results-dir=rerun")
    assert_outcomes(rerun, pytester.path / "rerun", xfailed=2, passed=1)


UPDATE_CATALOG = f"""models:
  - id: org/changed
    task: text-generation
    expect: {{result: FAIL, stage: load, reason: "{ISSUE}"}}
  - id: org/regressed
    task: text-generation
  - id: org/new
    task: text-generation
  - id: org/met
    task: text-generation
    # Known since the last release.
    expect: {{result: FAIL, stage: parity, reason: "{ISSUE}"}}
"""
EARLY, LATE = "2026-11-01T00:00:00+00:00", "2026-11-30T00:00:00+00:00"


def failed(model: str, stage: str, error: str, stamp: str = LATE, version: str = "5.25.0") -> Row:
    return Row(
        model_id=model, result="FAIL", failure_stage=stage, error=error, library_version=version, timestamp=stamp
    )


def expect_update(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_neuron_support.cli", "expect", "update", *args, "--models-file=models.yaml"],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )


def test_expect_update_refuses_a_changed_failure_and_a_pass_to_fail_unless_accepted(tmp_path: Path) -> None:
    catalog = tmp_path / "models.yaml"
    catalog.write_text(UPDATE_CATALOG)
    parity = "tokens differ from the CPU reference at index 3 of 32"
    write_rows(
        tmp_path / "results",
        [
            failed("org/changed", "parity", parity),  # expected at load: a changed failure
            # It passed on the older stack; now it fails: a PASS -> FAIL.
            Row(model_id="org/regressed", result="PASS", library_version="5.24.0", timestamp=EARLY),
            failed("org/regressed", "parity", parity),
            failed("org/new", "compile", "neuronx-cc failed with exit status 70"),  # never ran before: new
            failed("org/met", "parity", parity),  # as expected: its signature is written, its reason kept
        ],
    )
    new_line = '    expect: {result: "FAIL", stage: "compile", signature: '
    signature = failed("org/met", "parity", parity).signature  # what `neuron-support failures` groups by
    assert signature is not None

    # --dry-run: what would change, as a diff of the catalog; nothing written.
    dry = expect_update(tmp_path, "results", "--dry-run")
    assert dry.returncode == 1, dry.stderr
    assert catalog.read_text() == UPDATE_CATALOG
    assert "models.yaml: 2 expectation(s) would change from 5 row(s); nothing written" in dry.stdout
    assert f"\n+{new_line}" in dry.stdout and "\n-    expect: {result: FAIL, stage: parity" in dry.stdout

    done = expect_update(tmp_path, "results")
    assert done.returncode == 1
    refusals = done.stderr.splitlines()
    assert refusals[0] == (
        f"org/changed: not written: a changed failure: expected FAIL at load, got FAIL at parity "
        f"({signature}); the catalog keeps expect FAIL at load. If this is the new known state, accept it with "
        "its reason: --accept org/changed --reason URL"
    ), refusals
    assert refusals[1].startswith(
        f"org/regressed: not written: PASS -> FAIL at parity ({signature}): its row "
        "of 2026-11-01 (transformers 5.24.0, neuronx-cc none, cpu) passed; a regression is not a known failure; the "
        "catalog keeps no expectation (it passes)."
    ), refusals
    assert "models.yaml: 2 row(s) refused (above): their expectations are as they were" in done.stdout
    written = {m.id: m.expect for m in parse_catalog(catalog.read_text(), "models.yaml").models}
    # The refused entries as they were; the new failure and the met one written; the comment kept.
    assert written["org/changed"] == Expectation(result="FAIL", reason=ISSUE, stage="load")
    assert written["org/regressed"] is None
    assert written["org/new"] is not None and written["org/new"].stage == "compile"
    assert written["org/new"].reason.startswith("found by the sweep of 2026-11-30")
    assert written["org/met"] == Expectation(result="FAIL", reason=ISSUE, stage="parity", signature=signature)
    assert "    # Known since the last release.\n" in catalog.read_text()

    # Accepted on the command line, each with its reason: written with that reason.
    usage = expect_update(tmp_path, "results", "--accept", "org/changed")
    assert usage.returncode == 2 and "each --accept MODEL needs its own --reason" in usage.stderr
    url = "https://example.org/upstream/issues/8"
    accepted = expect_update(
        tmp_path, "results", "--accept", "org/changed", "--reason", url, "--accept", "org/regressed", "--reason", url
    )
    assert accepted.returncode == 0, accepted.stderr
    assert f"org/changed: expect FAIL at parity, signature {signature!r}… (accepted on the command line: {url})" in (
        accepted.stdout
    )
    after = {m.id: m.expect for m in parse_catalog(catalog.read_text(), "models.yaml").models}
    for model in ("org/changed", "org/regressed"):
        assert after[model] == replace(written["org/met"], reason=url), model


def test_expect_update_reads_a_pass_to_fail_against_the_baseline_sweep(tmp_path: Path) -> None:
    (tmp_path / "models.yaml").write_text("models:\n  - id: org/regressed\n    task: text-generation\n")
    write_rows(tmp_path / "published", [Row(model_id="org/regressed", result="PASS", timestamp=EARLY)])
    write_rows(tmp_path / "results", [failed("org/regressed", "load", "OSError: no such file")])
    refused = expect_update(tmp_path, "results", "--baseline", "published")
    assert refused.returncode == 1 and "org/regressed: not written: PASS -> FAIL at load" in refused.stderr
    assert (tmp_path / "models.yaml").read_text().count("expect") == 0
    typo = expect_update(tmp_path, "results", "--baseline", "publsihed")
    assert typo.returncode == 2 and "publsihed holds no dataset" in typo.stderr
