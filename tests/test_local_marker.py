"""A user's own test on a checkpoint folder of their own: ``@pytest.mark.neuron_model("./my-model")``, the
README's local form, runs as ``--model=./my-model`` does (issue 39: the marker used to overwrite the folder's
``local`` source with ``test``, and setup failed with huggingface_hub's ``HFValidationError`` on the path)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from faultkit import assert_outcomes

from pytest_neuron_support import zoo
from pytest_neuron_support.session.fixtures import model_from_marker

LOCAL_TEST = """
import pytest


@pytest.mark.neuron_model("./my-model", prompt={prompt})
def test_my_checkpoint(neuron_model, neuron_run):
    assert neuron_model.source == "local"
    assert neuron_run.tokens and neuron_run.tokens == neuron_run.tokens_again
"""


def _copy_of(zoo_cache: Path, name: str, into: Path) -> Path:
    """A plain folder holding a zoo checkpoint's files (the snapshot's links followed), as a user's
    ``save_pretrained`` leaves one."""
    repo = zoo_cache / f"models--tiny-random--{name}"
    snapshot = repo / "snapshots" / (repo / "refs" / "main").read_text().strip()
    shutil.copytree(snapshot, into)
    assert not any(path.is_symlink() for path in into.iterdir())
    return into


@pytest.mark.slow
@pytest.mark.usefixtures("eager_compile")
def test_the_marker_runs_a_local_checkpoint_folder(pytester: pytest.Pytester, offline_hub: Path) -> None:
    folder = _copy_of(offline_hub, "llama", pytester.path / "my-model")
    pytester.makepyfile(test_mine=LOCAL_TEST.format(prompt=json.dumps(zoo.TINY_PROMPT)))
    result = pytester.runpytest_subprocess("--device=cpu", "--results-dir=out", "--model-timeout=600")
    assert_outcomes(result, pytester.path / "out", passed=1)
    assert "HFValidationError" not in result.stdout.str()
    [row] = pd.read_parquet(pytester.path / "out" / "data").to_dict("records")
    # The row is the test's, about the folder: loaded from disk, nothing asked of the Hub.
    assert (row["result"], row["source"], row["test"]) == ("PASS", "test", "test_mine.py::test_my_checkpoint")
    assert row["model_id"] == str(folder)
    assert str(folder) in row["runscript"]


def test_a_marker_keeps_a_folder_local_and_a_hub_id_the_tests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my-model").mkdir()
    monkeypatch.chdir(tmp_path)
    local = model_from_marker(("./my-model",), {"prompt": "Hello"})
    assert (local.id, local.source, local.prompt) == (str(tmp_path / "my-model"), "local", "Hello")
    assert model_from_marker(("org/name",), {}).source == "test"
