"""The plugin as users run it (pytester), on paths that start no model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

CATALOG = """
models:
  - id: org/alpha-qwen
    task: text-generation
    tags: [qwen3, dense]
  - id: org/big-one
    task: text-generation
    exclude: {reason: too-large, note: "needs 40 cores"}
  - id: org/remote
    task: text-generation
    trust_remote_code: true
"""


def test_help_imports_neither_torch_nor_transformers() -> None:
    code = (
        "import sys, pytest\n"
        "try:\n    pytest.main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('IMPORTED', sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "--neuron-cores" in out and "--models-file" in out
    assert "IMPORTED []" in out


def test_collect_only_lists_one_item_per_entry_named_by_hub_id(pytester: pytest.Pytester) -> None:
    pytester.makefile(".yaml", models=CATALOG)
    result = pytester.runpytest_subprocess("--device=cpu", "--collect-only", "-q")
    # One parametrized test, its ids the Hub ids, in cost order (unplanned entries cost nothing).
    result.stdout.fnmatch_lines(
        [
            "models.yaml::test_model[org/alpha-qwen]",
            "models.yaml::test_model[org/big-one]",
            "models.yaml::test_model[org/remote]",
        ]
    )
    by_tag = pytester.runpytest_subprocess("--device=cpu", "--collect-only", "-q", "-k", "qwen3")
    by_tag.stdout.fnmatch_lines(["models.yaml::test_model[org/alpha-qwen]", "*1/3 tests collected (2 deselected)*"])
    by_id = pytester.runpytest_subprocess("--device=cpu", "--collect-only", "-q", "-k", "org/remote")
    by_id.stdout.fnmatch_lines(["models.yaml::test_model[org/remote]", "*1/3 tests collected (2 deselected)*"])


def test_excluded_and_remote_code_entries_are_skipped_rows(pytester: pytest.Pytester) -> None:
    pytester.makefile(".yaml", models=CATALOG)
    result = pytester.runpytest_subprocess("--device=cpu", "-k", "big or remote", "-rs", "--results-dir=out")
    result.assert_outcomes(skipped=2, deselected=1)
    result.stdout.fnmatch_lines(["*excluded (too-large): needs 40 cores*", "*--allow-remote-code*"])
    df = pd.read_parquet(pytester.path / "out" / "data").set_index("model_id")
    assert df.loc["org/big-one", "result"] == "EXCLUDED"
    assert df.loc["org/big-one", "exclude_reason"] == "too-large"
    assert df.loc["org/remote", "exclude_reason"] == "remote-code"
    assert (pytester.path / "out" / "README.md").exists()


def test_models_file_option_selects_another_catalog(pytester: pytest.Pytester) -> None:
    pytester.makefile(".yaml", models=CATALOG)
    other = pytester.path / "sub" / "mine.yaml"
    other.parent.mkdir()
    other.write_text("models:\n  - id: me/mine\n    task: text-generation\n")
    result = pytester.runpytest_subprocess("--device=cpu", f"--models-file={other}", "--collect-only", "-q")
    result.stdout.fnmatch_lines(["sub/mine.yaml::test_model[me/mine]", "*1 test collected*"])


def test_model_option_adds_models(pytester: pytest.Pytester) -> None:
    pytester.makefile(".yaml", models=CATALOG)
    result = pytester.runpytest_subprocess(
        "--device=cpu", "--model=me/extra", "--model=org/remote", "--collect-only", "-q"
    )
    result.stdout.fnmatch_lines(["models.yaml::test_model[me/extra]", "*4 tests collected*"])


def test_plain_test_runs_are_untouched(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_x="def test_x():\n    assert True\n")
    result = pytester.runpytest_subprocess("test_x.py")
    result.assert_outcomes(passed=1)
    assert not (pytester.path / "results").exists()


def test_repo_catalogs_collect(pytester: pytest.Pytester) -> None:
    repo = Path(__file__).resolve().parent.parent
    result = pytester.runpytest_subprocess(
        "--device=cpu", f"--models-file={repo / 'models.yaml'}", "--collect-only", "-q"
    )
    result.stdout.fnmatch_lines(["*::test_model[[]Qwen/Qwen3-8B[]]", "* tests collected*"])


def test_repository_root_runs_the_catalog_and_tests_apart(tmp_path: Path, offline_hub: Path) -> None:
    # The root conftest.py: `pytest .` at the repository root is a sweep of the catalog only (the
    # project's tests never ride along), and the header says which suite a session runs.
    repo = Path(__file__).resolve().parent.parent
    common = ["-p", "no:cacheprovider", f"--basetemp={tmp_path / 'base'}", "--collect-only"]

    def collect(*args: str) -> str:
        command = [sys.executable, "-m", "pytest", *common, *args]
        done = subprocess.run(command, cwd=repo, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    sweep = collect(".", "--device=cpu", "--models-file=models-tiny.yaml", f"--results-dir={tmp_path / 'out'}")
    assert "suite: the catalog models-tiny.yaml (28 models)" in sweep, sweep
    items = [line.strip() for line in sweep.splitlines() if line.strip().startswith("<Function ")]
    # One item per model, and one per Pipeline check (the text classifier's, the image classifier's, the CTC
    # recogniser's, the depth model's).
    assert len(items) == 32 and all(
        line.startswith(("<Function test_model[", "<Function test_pipeline[")) for line in items
    )
    assert sorted(line for line in items if "test_pipeline[" in line) == [
        "<Function test_pipeline[tiny-random/depth-anything]>",
        "<Function test_pipeline[tiny-random/distilbert-sst2]>",
        "<Function test_pipeline[tiny-random/vit]>",
        "<Function test_pipeline[tiny-random/wav2vec2-ctc]>",
    ]
    # Largest expected work first (cores x seconds): the 4-core olmo2, then the pipeline, whose task's prior
    # is three text runs (a text model's prior would start it seventh, to finish alone at the end).
    assert items[:2] == [
        "<Function test_model[tiny-random/olmo2]>",
        "<Function test_model[tiny-random/stable-diffusion]>",
    ]
    assert "<Module test_" not in sweep and "<Dir tests>" not in sweep, sweep
    own = collect("tests/test_options.py")
    assert "suite: the project's own tests (tests/)" in own and "<Module test_options.py>" in own, own


@pytest.mark.usefixtures("eager_compile")
@pytest.mark.usefixtures("shared_references")
def test_model_option_works_where_there_is_no_catalog(pytester: pytest.Pytester, offline_hub: Path) -> None:
    # A project of the user's own: no models.yaml. `pytest --model org/name` checks that model,
    # beside the project's own tests, with -n 2 as well, and its row is in the dataset.
    pytester.makepyfile(test_mine="def test_mine():\n    assert True\n")
    listed = pytester.runpytest_subprocess("--device=cpu", "--model=tiny-random/qwen3", "--collect-only", "-q")
    listed.stdout.fnmatch_lines(["models.yaml::test_model[[]tiny-random/qwen3[]]", "test_mine.py::test_mine"])
    assert not (pytester.path / "models.yaml").exists()
    result = pytester.runpytest_subprocess(
        "--device=cpu", "--model=tiny-random/qwen3", "-n", "2", "--results-dir=out", "-k", "qwen3"
    )
    result.assert_outcomes(passed=1)  # test_mine deselected by -k (xdist does not count deselections)
    [row] = pd.read_parquet(pytester.path / "out" / "data").to_dict("records")
    assert (row["model_id"], row["source"], row["result"], row["test"]) == ("tiny-random/qwen3", "cli", "PASS", "")
