"""A model the Hub will not give: missing (404), gated (401), or the Hub unreachable. Each is an
ERROR row at stage load, with the Hub's answer, and the sweep goes on. The Hub is a real loopback
HTTP server speaking its API (tests/hubserver.py), selected with HF_ENDPOINT."""

from __future__ import annotations

import socket

import pandas as pd
import pytest
from hubserver import HubServer, ModelRecord

pytestmark = pytest.mark.slow

CATALOG = """
models:
  - {id: nobody/missing-model, task: text-generation}
  - {id: meta-llama/gated-model, task: text-generation}
"""


def test_missing_and_gated_models_are_load_errors(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    gated = ModelRecord(id="meta-llama/gated-model", gated="manual", files={"config.json": b"{}"})
    with HubServer([gated]) as server:
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("HF_HUB_CACHE", str(pytester.path / "hub"))
        monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
        pytester.makefile(".yaml", models=CATALOG)
        result = pytester.runpytest_subprocess("--device=cpu", "--results-dir=out", "--model-timeout=300")
        asked = {request.path for request in server.requests}
    result.assert_outcomes(failed=2)
    df = pd.read_parquet(pytester.path / "out" / "data").set_index("model_id")
    missing, locked = df.loc["nobody/missing-model"], df.loc["meta-llama/gated-model"]
    assert (missing.result, missing.failure_stage) == ("ERROR", "load")
    assert "not a valid model identifier" in missing.error or "RepositoryNotFound" in missing.error
    assert (locked.result, locked.failure_stage) == ("ERROR", "load")
    assert "gated" in locked.error.lower()
    assert any(path.startswith("/meta-llama/gated-model/resolve/") for path in asked)  # run.py asked our Hub


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_unreachable_hub_is_a_load_error_not_a_hang(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(pytester.path / "hub"))
    pytester.makefile(".yaml", models="models:\n  - {id: nobody/anything, task: text-generation}\n")
    result = pytester.runpytest_subprocess("--device=cpu", "--results-dir=out", "--model-timeout=300")
    result.assert_outcomes(failed=1)
    row = pd.read_parquet(pytester.path / "out" / "data").iloc[0]
    assert (row.result, row.failure_stage) == ("ERROR", "load"), row.error
    assert "connect" in row.error.lower(), row.error
