"""The options module: argparse type= validators (UsageError with the flag, value and fix) that
leave plain values in config.option, which xdist ships to its workers."""

from __future__ import annotations

import pytest

from pytest_neuron_support.planning.planner import DEFAULT_HEADROOM
from pytest_neuron_support.session import options


@pytest.mark.parametrize(
    ("check", "value", "message"),
    [
        (options.positive_int("--neuron-cores"), "zero", "--neuron-cores='zero' is not an integer"),
        (options.positive_int("--max-new-tokens", 4096), "5000", "at least 1 and at most 4096"),
        (options.positive_float("--core-memory-gib", "24"), "-1", "--core-memory-gib='-1' must be a positive number"),
        (options.seconds("--model-timeout"), "soon", "positive number of seconds, e.g. --model-timeout=3600"),
        (options.fraction("--memory-headroom"), "1", "must be a fraction in [0, 1)"),
        (options.non_negative_seconds("--progress-interval"), "-1", "0 or a positive number of seconds"),
        (options.non_negative_seconds("--progress-interval"), "nan", "e.g. --progress-interval=60"),
        (options.core_choice, "3", "--max-cores=3 is not a core count a model can use; pass one of 1, 2, 4, 8, 16"),
        (options.prompt_text, "   ", "--prompt is empty"),
        (options.judge_model_id, "no id", "--judge-model='no id' is not a Hub id"),
        (options.shard_spec, "3/2", "3/2"),
        (options.cpu_threads, "many", "--cpu-threads='many' is not an integer; pass a whole number, e.g. "),
        (options.cpu_threads, "0", "at least 1, or --cpu-threads=auto"),
    ],
)
def test_validators_raise_usage_errors_that_name_the_fix(check: object, value: str, message: str) -> None:
    assert callable(check)
    with pytest.raises(pytest.UsageError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        check(value)


def test_validators_return_plain_values() -> None:
    assert options.positive_int("--neuron-cores")("16") == 16
    assert options.core_choice("8") == 8
    assert options.fraction("--memory-headroom")("0.25") == 0.25
    assert options.non_negative_seconds("--progress-interval")("0") == 0.0
    assert options.shard_spec("1/4") == "1/4"
    assert (options.cpu_threads("auto"), options.cpu_threads("6")) == (None, 6)
    assert options.judge_model_id("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"


def test_parsed_options_are_plain_values_for_xdist(pytester: pytest.Pytester) -> None:
    # Defaults go through the validators too (argparse applies type= to string defaults).
    config = pytester.parseconfig("--neuron-cores=4", "--shard=0/2", "--core-memory-gib=12")
    values = {
        name: config.getoption(name)
        for name in ("neuron_cores", "max_new_tokens", "model_timeout", "max_cores", "memory_headroom", "shard")
    }
    assert values == {
        "neuron_cores": 4,
        "max_new_tokens": 32,
        "model_timeout": 3600.0,
        "max_cores": 16,
        "memory_headroom": DEFAULT_HEADROOM,
        "shard": "0/2",
    }
    assert isinstance(values["memory_headroom"], float)
    assert config.getoption("core_memory_gib") == 12.0
    parsed = options.parse_options(config)
    assert (parsed.neuron_cores, parsed.shard is not None and (parsed.shard.index, parsed.shard.count)) == (4, (0, 2))
