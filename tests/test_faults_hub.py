"""A model the Hub will not give: missing (404), gated (401), or the Hub unreachable. The planner
cannot read its config, so each is an ERROR row at stage plan, with the Hub's answer and what to pass
(a core count in the catalog), never a run on a guessed core count; the sweep goes on. With `cores:`
set, the model runs and its load says what the Hub answered. The Hub is a real loopback
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
    assert (missing.result, missing.failure_stage, missing.verdict_basis) == ("ERROR", "plan", "plan")
    assert "RepositoryNotFound" in missing.error, missing.error
    assert (locked.result, locked.failure_stage) == ("ERROR", "plan")
    assert "gated" in locked.error.lower()
    for row in (missing, locked):
        assert "'cores: N' in its catalog entry (line" in row.error and pd.isna(row.neuron_cores), row.error
    assert any(path.startswith("/meta-llama/gated-model/resolve/") for path in asked)  # the planner asked our Hub


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_unreachable_hub_is_a_load_error_not_a_hang(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(pytester.path / "hub"))
    # Planned (ERROR at plan) and, with the user's core count, run (ERROR at load): neither hangs.
    catalog = (
        "models:\n  - {id: nobody/anything, task: text-generation}\n"
        "  - {id: nobody/sized, task: text-generation, cores: 1}\n"
    )
    pytester.makefile(".yaml", models=catalog)
    result = pytester.runpytest_subprocess("--device=cpu", "--results-dir=out", "--model-timeout=300")
    result.assert_outcomes(failed=2)
    rows = pd.read_parquet(pytester.path / "out" / "data").set_index("model_id")
    planned, sized = rows.loc["nobody/anything"], rows.loc["nobody/sized"]
    assert (planned.result, planned.failure_stage) == ("ERROR", "plan"), planned.error
    assert "'cores: N'" in planned.error, planned.error
    # One reachability check up front: the row names the endpoint and what it answered.
    assert planned.error.endswith(f"the Hub was not asked: {endpoint} is unreachable (Connection refused)"), (
        planned.error
    )
    assert (sized.result, sized.failure_stage, sized.neuron_cores) == ("ERROR", "load", 1), sized.error
    assert "connect" in sized.error.lower(), sized.error
    assert "catalog override: 1 core(s), not inspected" in sized.plan_reason
