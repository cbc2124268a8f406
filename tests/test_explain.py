"""What a failed verdict assert prints (explain.py): the evidence of the row, like a list diff."""

from __future__ import annotations

from pathlib import Path

from pytest_neuron_support.data.records import Row
from pytest_neuron_support.session.explain import Verdict, explain

RUNS = Path("/results/runs/org--m/cpu")


def test_a_one_core_parity_failure_shows_prefix_divergence_tokens_and_gap() -> None:
    row = Row(
        model_id="org/m",
        result="FAIL",
        failure_stage="parity",
        verdict_basis="parity+teacher-forced",
        tokens=(1, 2, 3, 4, 9, 9, 9, 9, 9, 9),
        reference_tokens=(1, 2, 3, 4, 5, 6, 7, 8, 9, 10),
        matched_prefix=4,
        first_divergence=4,
        device_token=9,
        reference_token=5,
        logprob_gap=0.031,
        near_tie=True,
    )
    lines = explain("==", Verdict(row, RUNS), "PASS")
    assert lines == [
        "'FAIL' == 'PASS'",
        "org/m: FAIL at stage parity, decided by parity+teacher-forced",
        "matched prefix 4 of 10; first divergence at index 4: device 9 != CPU 5, gap 0.0310 nats (a near-tie)",
        "- CPU    [1, 2, 3, 4, 5, 6, 7, 8, 9, ...]",
        "+ device [1, 2, 3, 4, 9, 9, 9, 9, 9, ...]",
        f"run.py, result.json and log.txt: {RUNS}",
    ]


def test_an_error_shows_its_stage_and_text_and_other_comparisons_are_left_to_pytest() -> None:
    row = Row(model_id="org/m", result="ERROR", failure_stage="compile", verdict_basis="run", error="boom")
    verdict = Verdict(row, RUNS)
    assert verdict == "ERROR" and isinstance(verdict, str)
    assert explain("==", verdict, "PASS") == [
        "'ERROR' == 'PASS'",
        "org/m: ERROR at stage compile, decided by run",
        "error: boom",
        f"run.py, result.json and log.txt: {RUNS}",
    ]
    assert explain("!=", verdict, "PASS") is None
    assert explain("==", "ERROR", "PASS") is None
