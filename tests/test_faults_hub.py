"""A model the Hub will not give: missing (404), gated (401), or the Hub unreachable. The planner
cannot read its config, so each is an ERROR row at stage plan, with the Hub's answer and what to pass
(a core count in the catalog), never a run on a guessed core count; the sweep goes on. With `cores:`
set, the model runs and its load says what the Hub answered; a Hub the session found unreachable
makes every run offline (HF_HUB_OFFLINE=1), so its load fails at once, in one line naming the cause.
The Hub is a real loopback HTTP server speaking its API (tests/hubserver.py), selected with
HF_ENDPOINT, or a closed loopback port."""

from __future__ import annotations

import socket
import time

import pandas as pd
import pytest
from hubserver import HubServer, ModelRecord

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("eager_compile")]

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


@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["one-process", "xdist"])
def test_an_unreachable_hub_is_a_load_error_not_a_hang(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, workers: tuple[str, ...]
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
    start = time.monotonic()
    result = pytester.runpytest_subprocess("--device=cpu", "--results-dir=out", "--model-timeout=300", *workers)
    elapsed = time.monotonic() - start
    result.assert_outcomes(failed=2)
    down = f"{endpoint} is unreachable (Connection refused)"
    result.stderr.fnmatch_lines([f"neuron-support: the Hub is not reachable: {down}; *(HF_HUB_OFFLINE=1)"])
    rows = pd.read_parquet(pytester.path / "out" / "data").set_index("model_id")
    planned, sized = rows.loc["nobody/anything"], rows.loc["nobody/sized"]
    assert (planned.result, planned.failure_stage) == ("ERROR", "plan"), planned.error
    # One reachability check up front: the row names the model, that it is not cached, and what the
    # endpoint answered, in one short line.
    assert planned.error == (
        f"nobody/anything (revision main) is not in the local Hugging Face cache and the Hub cannot be asked"
        f" ({down}); check the id, or download it where the Hub is reachable (hf download nobody/anything)"
        " and rerun"
    ), planned.error
    assert (sized.result, sized.failure_stage, sized.neuron_cores) == ("ERROR", "load", 1), sized.error
    assert "catalog override: 1 core(s), not inspected" in sized.plan_reason
    # The session's finding reached the run (through workerinput under xdist): it ran offline, so
    # its load failed from the cache at once, in one line naming the cause.
    assert sized.error == (
        "OSError: nobody/sized is not in the local cache, and the run was offline (HF_HUB_OFFLINE=1): "
        f"the Hub was found unreachable at session start: {down}"
    ), sized.error
    runs = pytester.path / "out" / "runs" / "nobody--sized" / "cpu"
    for run in ("device", "reference"):  # neither process asked the closed port (no client retries)
        log = (runs / run / "log.txt").read_text(encoding="utf-8")
        assert "stage=load" in log and "Retrying in" not in log and "thrown while requesting" not in log, log
    # Online, the client's retries (1+2+4+8+8 s per request, twice) made this run take about 51 s;
    # offline it is Python and torch starting. A generous bound for a loaded machine (the session's
    # own wall time, mostly xdist and interpreter start-up, is only reported).
    assert sized.run_s < 40, (sized.run_s, elapsed)
