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


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--neuron-cores=zero"], "--neuron-cores='zero' is not an integer; pass a whole number"),
        (["--neuron-cores=0"], "--neuron-cores=0 is out of range; pass a number of at least 1"),
        (["--neuron-cores=100000"], "--neuron-cores=100000 is more than the * core(s) the cpu device reports"),
        (["--max-new-tokens=-3"], "--max-new-tokens=-3 is out of range"),
        (["--max-new-tokens=lots"], "--max-new-tokens='lots' is not an integer"),
        (["--model-timeout=0"], "--model-timeout='0' must be a positive number of seconds"),
        (["--model-timeout=soon"], "--model-timeout='soon' must be a positive number of seconds"),
        (["--device=tpu"], "*argument --device: invalid choice: 'tpu'*"),
        (["--prompt=  "], "--prompt is empty*"),
        (["--model=../etc"], "--model: local checkpoint directory does not exist*"),
        (["--model=no id"], "--model: not a Hub model id*"),
        (["--models-file=nope.yaml"], "*nope.yaml: file not found; pass an existing file with --models-file"),
        (["--reference-dtype=int8"], "*argument --reference-dtype: invalid choice: 'int8'*"),
    ],
)
def test_bad_command_line_values_are_usage_errors_with_the_fix(
    pytester: pytest.Pytester, args: list[str], message: str
) -> None:
    pytester.makefile(".yaml", models=CATALOG)
    result = pytester.runpytest_subprocess("--device=cpu", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}*"])


def test_malformed_catalog_stops_the_run_with_one_clear_error(pytester: pytest.Pytester) -> None:
    pytester.makefile(".yaml", models="models:\n  - id: org/x\n    task: text-generation\n    cores: 3\n")
    result = pytester.runpytest_subprocess("--device=cpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*models.yaml:4: entry 'org/x': field 'cores': not an allowed core count (got 3)*"])


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
