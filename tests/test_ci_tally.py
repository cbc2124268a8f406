""".ci/run's tally: every collected test must run, and a skip passes only if .ci/allowed-skips lists it.
The root conftest.py writes the tally (on the controller only), .ci/tally.py judges it; both are run
here as CI runs them, on a session of their own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
TESTS = """
import pytest

def test_passes():
    pass

def test_skips():
    pytest.skip("no widget here")

def test_fails():
    assert False
"""


def tally(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, *args: str, tests: str = TESTS
) -> tuple[dict[str, Any], Path]:
    pytester.makeconftest((REPO / "conftest.py").read_text(encoding="utf-8"))
    pytester.makepyfile(test_some=tests)
    path = pytester.path / "tally.json"
    monkeypatch.setenv("NEURON_SUPPORT_TEST_TALLY", str(path))
    pytester.runpytest_subprocess("-p", "no:neuron_support", "-p", "no:cacheprovider", *args)
    return json.loads(path.read_text(encoding="utf-8")), path


def judge(path: Path, allowed: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    allow = tmp_path / "allowed-skips"
    allow.write_text(allowed, encoding="utf-8")
    return subprocess.run(
        [sys.executable, str(REPO / ".ci" / "tally.py"), str(path), str(allow)],
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize("workers", [(), ("-n", "2")])
def test_the_tally_counts_what_ran_and_refuses_a_skip_not_allowed(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, workers: tuple[str, ...]
) -> None:
    found, path = tally(pytester, monkeypatch, *workers)
    ids = [f"test_some.py::test_{name}" for name in ("passes", "skips", "fails")]
    assert sorted(found["collected"]) == sorted(ids)
    assert found["outcomes"] == dict(zip(ids, ["passed", "skipped", "failed"], strict=True))
    assert "no widget here" in found["skips"][ids[1]]
    refused = judge(path, "# nothing allowed\n", tmp_path)
    assert refused.returncode == 1
    assert ".ci/tally: collected 3, ran 3 (1 failed, 1 passed, 1 skipped)" in refused.stdout
    assert "skipped (NOT ALLOWED): test_some.py::test_skips: " in refused.stdout
    assert "test_some.py::test_skips skipped and is not on" in refused.stderr
    allowed = judge(path, "test_some.py::test_sk*  # the widget is optional\n", tmp_path)
    assert allowed.returncode == 0, allowed.stderr


def test_a_collected_test_that_never_ran_fails_the_tally(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # -x stops after the first failure: the test collected after it never runs.
    found, path = tally(
        pytester, monkeypatch, "-x", tests="def test_fails():\n    assert False\n\n\ndef test_after():\n    pass\n"
    )
    assert found["collected"] == ["test_some.py::test_fails", "test_some.py::test_after"]
    judged = judge(path, "", tmp_path)
    assert judged.returncode == 1
    assert ".ci/tally: collected 2, ran 1 (1 failed)" in judged.stdout
    assert "1 collected but never ran: test_some.py::test_after" in judged.stderr


XFAILS = """
import pytest

def test_passes():
    pass

@pytest.mark.xfail(reason="left behind")
def test_marked():
    assert False

def test_imperative():
    pytest.xfail("gave up")
"""


def test_a_project_test_that_ends_xfailed_did_not_run_and_fails_the_tally_unless_allowed(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # An xfail turns a failing body into a green outcome: the tally used to count it as ran and pass the run.
    found, path = tally(pytester, monkeypatch, tests=XFAILS)
    marked, imperative = "test_some.py::test_marked", "test_some.py::test_imperative"
    assert found["outcomes"][marked] == found["outcomes"][imperative] == "xfailed"
    judged = judge(path, "", tmp_path)
    assert judged.returncode == 1
    assert ".ci/tally: collected 3, ran 1 (1 passed), 2 xfailed (not counted as ran)" in judged.stdout
    assert f".ci/tally: xfailed (NOT ALLOWED): {marked}" in judged.stdout
    assert f"{marked} ended xfailed (its body failed) and is not on" in judged.stderr
    assert f"{imperative} ended xfailed (its body failed) and is not on" in judged.stderr
    # Listed with its reason, as a skip is, it passes.
    allowed = judge(path, "test_some.py::test_marked  # r\ntest_some.py::test_imperative  # r\n", tmp_path)
    assert allowed.returncode == 0, allowed.stderr
