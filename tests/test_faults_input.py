"""Bad input: malformed command-line values and catalogs stop the run before any work, with
one message naming the file, the entry, the field, the value and the fix. (The catalog parser's
own cases, over twenty of them, are in tests/test_catalog.py.)"""

from __future__ import annotations

import pytest

CATALOG = "models:\n  - {id: org/alpha-qwen, task: text-generation}\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--neuron-cores=zero"], "--neuron-cores='zero' is not an integer; pass a whole number"),
        (["--neuron-cores=0"], "--neuron-cores=0 is out of range; pass a number of at least 1"),
        (
            ["--neuron-cores=100000"],
            "--neuron-cores=100000 is more than the 64 core(s) this session may use on the cpu device; pass at most 64",
        ),
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
