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
    result.stdout.fnmatch_lines(["models.yaml::org/alpha-qwen", "models.yaml::org/big-one", "models.yaml::org/remote"])
    selected = pytester.runpytest_subprocess("--device=cpu", "--collect-only", "-q", "-k", "qwen3")
    selected.stdout.fnmatch_lines(["models.yaml::org/alpha-qwen", "*1/3 tests collected (2 deselected)*"])


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
    result.stdout.fnmatch_lines(["sub/mine.yaml::me/mine", "*1 test collected*"])


def test_model_option_adds_models(pytester: pytest.Pytester) -> None:
    pytester.makefile(".yaml", models=CATALOG)
    result = pytester.runpytest_subprocess(
        "--device=cpu", "--model=me/extra", "--model=org/remote", "--collect-only", "-q"
    )
    result.stdout.fnmatch_lines(["*::me/extra", "*4 tests collected*"])


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
    result.stdout.fnmatch_lines(["*::Qwen/Qwen3-8B", "* tests collected*"])
