"""The paths a user takes with their own tests and their own models (issue 30, "The user's paths"):
``neuron_judge`` of a text, ``--opt value`` moving pytest's rootdir, the reference beside a user's
device run, marker errors, core counts in markers, ``--model`` ids of a symlink, and an unknown model
offline."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hubrefs import move_main, private_hub, snapshot
from judges import build_judge, expected_score, no_ids, yes_ids

from pytest_neuron_support.catalog.load import CatalogError, check_cores, cli_model, parse_catalog
from pytest_neuron_support.session.fixtures import MarkerError, model_from_marker
from pytest_neuron_support.verdict.fluency import text_precheck

CATALOG = "models:\n  - {id: org/alpha-qwen, task: text-generation}\n"


def _snapshot(zoo_cache: Path, name: str) -> Path:
    repo = zoo_cache / f"models--tiny-random--{name}"
    return repo / "snapshots" / (repo / "refs" / "main").read_text().strip()


@pytest.mark.slow
def test_neuron_judge_judges_a_text(pytester: pytest.Pytester, tiny_zoo_cache: Path, tmp_path: Path) -> None:
    # A judge whose P(yes) is known in closed form: a text handed to neuron_judge reaches it (it used to
    # be given no tokens, so the precheck called every text "empty output" and no judge ever ran).
    judge = build_judge(tiny_zoo_cache, tmp_path / "judge", yes_logit=6.0, no_logit=1.0)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(judge)
    score = expected_score(len(yes_ids(tokenizer)), len(no_ids(tokenizer)), 6.0, 1.0)
    pytester.makepyfile(
        test_mine="""
import json
from pathlib import Path


def test_a_text(neuron_judge):
    verdict = neuron_judge("The printing press spread books across Europe.")
    Path("verdict.json").write_text(json.dumps([verdict.fluent, verdict.verdict, verdict.score]))
    assert neuron_judge("   ").verdict == "precheck: empty output"
"""
    )
    result = pytester.runpytest_subprocess("--device=cpu", f"--judge-model={judge}", "--results-dir=out")
    result.assert_outcomes(passed=1)
    fluent, verdict, got = json.loads((pytester.path / "verdict.json").read_text())
    assert (fluent, verdict) == (True, "fluent")
    assert got == pytest.approx(score, abs=1e-4)
    [row] = pd.read_parquet(pytester.path / "out" / "data").to_dict("records")
    # The row keeps the last verdict: the blank text's precheck.
    assert (row["result"], row["judge_verdict"], row["judge_model"]) == ("PASS", "precheck: empty output", str(judge))


def test_text_precheck_reads_only_the_text() -> None:
    assert text_precheck("A sentence anyone can read.") is None
    assert text_precheck(" \n ") == "empty output"
    assert text_precheck("\x00\x01\x02\x03 ok") == "mostly non-printable (3 of 7 characters print)"


def _own_project(pytester: pytest.Pytester) -> None:
    """A project of the user's: its configuration runs the catalog (testpaths), and it has tests of its own."""
    pytester.makepyprojecttoml('[tool.pytest.ini_options]\ntestpaths = ["models.yaml"]\n')
    pytester.makefile(".yaml", models=CATALOG)
    pytester.mkdir("tests")
    (pytester.path / "tests" / "test_own.py").write_text("def test_own():\n    pass\n")


def test_a_spaced_path_value_that_moves_the_rootdir_is_a_usage_error(
    pytester: pytest.Pytester, tmp_path_factory: pytest.TempPathFactory
) -> None:
    _own_project(pytester)
    outside = tmp_path_factory.mktemp("results")  # an existing folder outside the project
    spaced = pytester.runpytest_subprocess("--device=cpu", "--results-dir", str(outside), "--collect-only", "-q")
    assert spaced.ret == pytest.ExitCode.USAGE_ERROR, spaced.stdout.str()
    spaced.stderr.fnmatch_lines(
        [
            f"*--results-dir {outside}: pytest read '{outside}' as a test path when it chose its rootdir, so the "
            f"rootdir is * with no configuration file instead of {pytester.path} ({pytester.path / 'pyproject.toml'})"
            f"; write --results-dir={outside}"
        ]
    )
    assert "test_own" not in spaced.stdout.str()
    joined = pytester.runpytest_subprocess("--device=cpu", f"--results-dir={outside}", "--collect-only", "-q")
    assert joined.ret == pytest.ExitCode.OK
    joined.stdout.fnmatch_lines(["models.yaml::test_model[[]org/alpha-qwen[]]", "1 test collected*"])


def test_a_spaced_value_that_leaves_the_rootdir_alone_is_accepted(pytester: pytest.Pytester) -> None:
    # Inside the project the rootdir pytest finds is the same either way: nothing to stop.
    _own_project(pytester)
    pytester.mkdir("out")
    result = pytester.runpytest_subprocess("--device=cpu", "--results-dir", "out", "--collect-only", "-q")
    assert result.ret == pytest.ExitCode.OK, result.stderr.str()
    result.stdout.fnmatch_lines(["models.yaml::test_model[[]org/alpha-qwen[]]", "1 test collected*"])


REFERENCE_TEST = """
import json
import os
from pathlib import Path

import pytest


@pytest.mark.neuron_model("tiny-random/qwen3")
def test_beside(neuron_run, neuron_reference):
    started = neuron_reference.directory / "run.py"
    Path("seen.json").write_text(json.dumps({
        "cached": neuron_reference.cached,
        "reference_started": started.stat().st_mtime if started.exists() else None,
        "device_ended": (neuron_run.directory / "result.json").stat().st_mtime,
    }))
    assert neuron_run.tokens == neuron_reference.tokens
"""


@pytest.mark.slow
@pytest.mark.usefixtures("eager_compile")
def test_a_users_reference_runs_beside_the_device_run_or_comes_from_the_cache(
    pytester: pytest.Pytester, offline_hub: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each run records the commit of the Hub cache snapshot it loaded (transformers 5.24 keeps none on the
    # config, so every entry used to match every commit). The user's neuron_reference used to refuse an
    # entry the early start had skipped for being cached, so the second session ran its reference after
    # the device run.
    hub = private_hub(offline_hub, tmp_path / "hub", monkeypatch)
    loaded = snapshot(hub, "tiny-random/qwen3").name
    pytester.makepyfile(test_mine=REFERENCE_TEST)
    cache = tmp_path / "reference-cache"

    def session(results: str) -> dict[str, Any]:
        result = pytester.runpytest_subprocess(
            "--device=cpu", f"--reference-cache={cache}", f"--results-dir={results}", "--model-timeout=600"
        )
        result.assert_outcomes(passed=1)
        seen: dict[str, Any] = json.loads((pytester.path / "seen.json").read_text())
        rows = pd.read_parquet(pytester.path / results / "data").to_dict("records")
        seen["rows_cached"] = [row["reference_cached"] for row in rows]
        return seen

    # Nothing cached: the reference's run.py was written (its process started) before the device run ended.
    first = session("first")
    assert first["cached"] is False and first["reference_started"] < first["device_ended"]
    [entry] = cache.glob("*.json")
    assert json.loads(entry.read_text())["commit"] == loaded
    # Cached, of the commit refs/main names: the entry the early start was skipped for is the one used;
    # nothing runs after.
    second = session("second")
    assert second["cached"] is True and second["reference_started"] is None
    assert second["rows_cached"] == [True]
    # The Hub's main moved (a new snapshot under refs/main, as the next download leaves it): the entry is
    # the old commit's, so the reference reruns, started beside the device run, not after it.
    moved = move_main(hub, "tiny-random/qwen3", tmp_path / "pushed")
    third = session("third")
    assert third["cached"] is False and third["reference_started"] < third["device_ended"]
    assert third["rows_cached"] == [False]
    assert json.loads(entry.read_text())["commit"] == moved


MARKER_TESTS = """
import pytest


@pytest.mark.neuron_model("tiny-random/qwen3", dtype="float99")
def test_bad_dtype(neuron_model):
    pass


@pytest.mark.neuron_cores(3)
def test_three_cores(neuron_cores):
    pass
"""


def test_marker_mistakes_are_one_error_each_and_core_counts_follow_the_catalogs_rule(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_mine=MARKER_TESTS)
    result = pytester.runpytest_subprocess("--device=cpu", "--results-dir=out", "-rN")
    # neuron_cores(3) is the error the catalog's `cores: 3` is, not a SKIP.
    result.assert_outcomes(errors=2)
    out = result.stdout.str()
    dtype = "neuron_model: dtype='float99' is not allowed; use one of bfloat16, float16, float32"
    cores = "@pytest.mark.neuron_cores(3): not an allowed core count (got 3); use one of 1, 2, 4, 8, 16"
    assert out.count(dtype) == 1, out
    assert out.count(cores) == 1, out
    assert "During handling of the above exception" not in out, out


def test_one_rule_for_core_counts_in_markers_and_catalogs() -> None:
    rule = "not an allowed core count (got 3); use one of 1, 2, 4, 8, 16"
    with pytest.raises(CatalogError) as catalog:
        parse_catalog("models:\n  - {id: org/x, task: text-generation, cores: 3}\n", "cat.yaml")
    assert str(catalog.value) == f"cat.yaml:2: entry 'org/x': field 'cores': {rule}"
    with pytest.raises(MarkerError) as marker:
        model_from_marker(("org/x",), {"cores": 3})
    assert str(marker.value) == f"@pytest.mark.neuron_model('org/x'): field 'cores': {rule}"
    for bad in (0, 3, 32, True, 2.0, "2"):
        with pytest.raises(CatalogError, match="not an allowed core count"):
            check_cores(bad, "here")
    assert [check_cores(n, "here") for n in (None, 1, 2, 4, 8, 16)] == [None, 1, 2, 4, 8, 16]


def test_a_local_model_keeps_the_path_it_was_given(tmp_path: Path, tiny_zoo_cache: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(_snapshot(tiny_zoo_cache, "qwen3"), target_is_directory=True)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        model = cli_model("./link")
    finally:
        os.chdir(cwd)
    assert (model.id, model.source) == (str(link), "local")


def test_model_option_ids_are_the_path_as_given(pytester: pytest.Pytester, tiny_zoo_cache: Path) -> None:
    (pytester.path / "link").symlink_to(_snapshot(tiny_zoo_cache, "qwen3"), target_is_directory=True)
    result = pytester.runpytest_subprocess("--device=cpu", "--model=./link", "--collect-only", "-q", "-k", "link")
    result.stdout.fnmatch_lines([f"models.yaml::test_model[[]{pytester.path / 'link'}[]]", "1 test collected*"])


def test_an_unknown_model_offline_gets_a_short_true_error(pytester: pytest.Pytester) -> None:
    # HF_HUB_OFFLINE=1 (tests/conftest.py) and an empty cache: neither cached nor reachable.
    pytester.makepyfile(test_mine="def test_mine():\n    pass\n")
    result = pytester.runpytest_subprocess("--device=cpu", "--model=does-not/exist", "--results-dir=out", "-k", "exist")
    result.assert_outcomes(failed=1)
    [row] = pd.read_parquet(pytester.path / "out" / "data").to_dict("records")
    assert (row["result"], row["failure_stage"]) == ("ERROR", "plan")
    assert row["error"] == (
        "does-not/exist (revision main) is not in the local Hugging Face cache and the Hub cannot be asked "
        "(HF_HUB_OFFLINE=1); check the id, or download it where the Hub is reachable (hf download does-not/exist) "
        "and rerun"
    )
    assert len(row["error"]) < 250
