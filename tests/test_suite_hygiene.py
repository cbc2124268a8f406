"""The suite's own hygiene (tests/librarykeeper.py): an installed library imported during a test that
uses pytester stays imported, so the next test's import does not load it a second time. And its CPU
clock (tests/cpuclock.py), which says where the suite's time goes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

# A test that asks for pytester imports torch for the first time in its process, as a test that builds a
# model in-process does; the next test imports it again.
TWO_TESTS = """
import sys
pytest_plugins = ["pytester"]

def test_first(pytester):
    import torch
    import torch.distributed
    assert torch.ones(2).sum() == 2

def test_second():
    kept = "torch" in sys.modules
    import torch
    import torch.distributed
    assert kept and torch.ones(3).sum() == 3
"""


@pytest.fixture
def two_tests(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    pytester.makepyfile(test_two=TWO_TESTS)
    monkeypatch.setenv("PYTHONPATH", str(TESTS))  # librarykeeper, as conftest.py loads it
    return pytester


def test_the_keeper_keeps_torch_for_the_next_test(two_tests: pytest.Pytester) -> None:
    result = two_tests.runpytest_subprocess("-p", "no:cacheprovider", "-p", "librarykeeper")
    result.assert_outcomes(passed=2)


def test_without_the_keeper_the_second_import_fails(two_tests: pytest.Pytester) -> None:
    # What the keeper prevents: torch._C initialised again raises SystemError with a message read from
    # freed memory (its text varies), or, with other luck, the process dies of a signal.
    result = two_tests.runpytest_subprocess("-p", "no:cacheprovider")
    output = result.stdout.str()
    assert result.ret != 0 and "2 passed" not in output
    assert result.ret < 0 or ("SystemError" in output and "1 failed" in output), output[-3000:]


def test_the_suite_loads_the_keeper(request: pytest.FixtureRequest) -> None:
    assert request.config.pluginmanager.has_plugin("librarykeeper")


# One test that burns CPU in a child process it waits for, one that burns none.
CLOCKED = """
import subprocess, sys

def test_busy_child():
    subprocess.run([sys.executable, "-c", "x = 0\\nfor i in range(6_000_000): x += i"], check=True)

def test_idle():
    pass
"""


def test_the_cpu_clock_counts_a_tests_children_and_writes_nothing_unasked(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_clocked=CLOCKED)
    monkeypatch.setenv("PYTHONPATH", str(TESTS))  # cpuclock, as conftest.py loads it
    monkeypatch.delenv("NEURON_SUPPORT_TEST_CPU", raising=False)
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "cpuclock").assert_outcomes(passed=2)
    lines = pytester.path / "cpu.jsonl"
    assert not lines.exists()
    monkeypatch.setenv("NEURON_SUPPORT_TEST_CPU", str(lines))
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "cpuclock", "-n", "2").assert_outcomes(passed=2)
    clocked = {line["id"]: line for line in map(json.loads, lines.read_text().splitlines())}
    assert set(clocked) == {"test_clocked.py::test_busy_child", "test_clocked.py::test_idle"}
    busy, idle = clocked["test_clocked.py::test_busy_child"], clocked["test_clocked.py::test_idle"]
    # The child's loop is its CPU, counted as the test's children's; the idle test started no child.
    assert busy["children"] > 0.1 and busy["wall"] >= busy["children"] * 0.5 and idle["children"] == 0
    assert busy["worker"].startswith("gw") and idle["self"] < busy["children"]


def test_the_suite_loads_the_cpu_clock(request: pytest.FixtureRequest) -> None:
    assert request.config.pluginmanager.has_plugin("cpuclock")
