"""The controller plans every model once and hands the plans to the xdist workers: workers ask the
Hub nothing, so a flaky Hub cannot make them collect different lists (xdist would abort with
"Different tests were collected"), and a model the controller could not inspect is an ERROR at
stage plan that says what to pass, not a run on a guessed core count."""

from __future__ import annotations

import socket
from pathlib import Path

import pandas as pd
import pytest
from hubserver import HubServer, ModelRecord

REPO = Path(__file__).resolve().parent.parent
CONFIG = (REPO / "tests" / "fixtures" / "configs" / "Qwen_Qwen3-0.6B.json").read_bytes()
# Sizes that order the sweep differently depending on which plans succeed (cost grows with weights).
SIZES = {"org/a": 4096, "org/b": 2048, "org/c": 1024, "org/d": 512, "org/e": 256, "org/f": 128}


def _collect(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, *workers: str, fail_every: int = 2
) -> tuple[pytest.RunResult, list[str]]:
    """``--collect-only -q`` against a fresh loopback Hub that fails every other request; the
    result and the config.json requests the Hub saw."""
    models = [
        ModelRecord(id, pipeline_tag="text-generation", files={"config.json": CONFIG}, tensors={"w": ("BF16", (n, n))})
        for id, n in SIZES.items()
    ]
    with HubServer(models) as server:
        if fail_every:
            server.fail_with, server.fail_every = 500, fail_every
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        cache = pytester.path / f"hub-{'-'.join(workers)}"  # a fresh, empty cache per run
        monkeypatch.setenv("HF_HUB_CACHE", str(cache))
        monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
        result = pytester.runpytest_subprocess(
            "--device=cpu", "--results-dir=out", *workers, "--collect-only", "-q", "-p", "no:cacheprovider"
        )
        asked = [request.path for request in server.requests if request.path.endswith("/config.json")]
    return result, asked


def test_a_flaky_hub_gives_both_workers_one_plan(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makefile(".yaml", models="models:\n" + "".join(f"  - {{id: {m}, task: text-generation}}\n" for m in SIZES))
    alone, asked_alone = _collect(pytester, monkeypatch)
    assert alone.ret == pytest.ExitCode.OK, alone.stdout.str()
    result, asked = _collect(pytester, monkeypatch, "-n", "2")
    result.stdout.no_fnmatch_line("*Different tests were collected*")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    collected = [line for line in result.stdout.lines if "models.yaml::" in line]
    assert sorted(collected) == sorted(f"models.yaml::test_model[{m}]" for m in SIZES), result.stdout.str()
    # One planning pass, the controller's: exactly the requests of a session without workers (two
    # workers planning on their own would ask about twice as often, and see different failures).
    assert asked_alone and len(asked) == len(asked_alone), (asked, asked_alone)


def test_an_uninspectable_model_is_an_error_row_at_plan(pytester: pytest.Pytester, offline_hub: Path) -> None:
    # Offline and not in the cache: the planner cannot read its config. No guess: ERROR at plan.
    pytester.makefile(
        ".yaml",
        models="models:\n  - {id: tiny-random/qwen3, task: text-generation}\n"
        "  - {id: org/absent, task: text-generation}\n",
    )
    result = pytester.runpytest_subprocess(
        "--device=cpu", "--results-dir=out", "-n", "2", "-p", "no:cacheprovider", "-k", "absent"
    )
    result.assert_outcomes(failed=1)
    [row] = pd.read_parquet(pytester.path / "out" / "data").to_dict("records")
    assert (row["model_id"], row["result"], row["failure_stage"], row["verdict_basis"]) == (
        "org/absent",
        "ERROR",
        "plan",
        "plan",
    )
    assert row["error"] == (
        "org/absent (revision main) is not in the local Hugging Face cache and the Hub cannot be asked"
        " (HF_HUB_OFFLINE=1); check the id, or download it where the Hub is reachable (hf download org/absent)"
        " and rerun"
    )
    assert pd.isna(row["neuron_cores"]) and pd.isna(row["run_s"])


@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["alone", "xdist"])
def test_only_selected_models_are_inspected(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, workers: tuple[str, ...]
) -> None:
    # -k by Hub id and by tag: the Hub is asked about exactly the models that survive selection.
    entries = "".join(f"  - {{id: {m}, task: text-generation, tags: [size{n}]}}\n" for m, n in SIZES.items())
    pytester.makefile(".yaml", models="models:\n" + entries)
    result, asked = _collect(pytester, monkeypatch, *workers, "-k", "org/b or size128", fail_every=0)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    collected = sorted(line for line in result.stdout.lines if "models.yaml::" in line)
    assert collected == ["models.yaml::test_model[org/b]", "models.yaml::test_model[org/f]"], result.stdout.str()
    assert sorted({path.split("/resolve/")[0] for path in asked}) == ["/org/b", "/org/f"], asked


@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["alone", "xdist"])
def test_an_unreachable_hub_is_one_line_and_no_retries(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, workers: tuple[str, ...]
) -> None:
    pytester.makefile(".yaml", models="models:\n" + "".join(f"  - {{id: {m}, task: text-generation}}\n" for m in SIZES))
    with socket.socket() as sock:  # a port nothing listens on: the network unplugged
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_HUB_CACHE", str(pytester.path / "empty-hub"))
    result = pytester.runpytest_subprocess(
        "--device=cpu", "--results-dir=out", *workers, "--collect-only", "-q", "-p", "no:cacheprovider"
    )
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    said = [line for line in result.stderr.lines if "the Hub is not reachable" in line]
    assert said == [
        f"neuron-support: the Hub is not reachable: http://127.0.0.1:{port} is unreachable (Connection refused); "
        f"planning {len(SIZES)} model(s) from the local cache only (a model not in it is an ERROR at stage plan), "
        "and running them offline (HF_HUB_OFFLINE=1)"
    ], result.stderr.str()
    assert "Retrying" not in result.stdout.str() + result.stderr.str()
    assert len([line for line in result.stdout.lines if "models.yaml::" in line]) == len(SIZES)
