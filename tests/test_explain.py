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


def test_a_long_module_search_note_is_quoted_short_so_pytest_keeps_the_evidence_after_it() -> None:
    # pytest cuts an assertion message over 640 characters (outside CI): a sharded FAIL's whole "every module
    # inside" note pushed the token diff and the run folder out of what it printed.
    note = (
        "every one of 32 module outputs was inside the tolerance on the rerun: the fault is outside the modules (the "
        "code between them, such as a method the pipeline calls, or a decoding graph the rerun does not build) "
        "(device rerun 4.89 s, CPU rerun 0.02 s)"
    )
    row = Row(
        model_id="org/m",
        result="FAIL",
        failure_stage="parity",
        verdict_basis="parity+teacher-forced",
        tokens=(1, 2, 9),
        reference_tokens=(1, 2, 3),
        matched_prefix=2,
        first_divergence=2,
        device_token=9,
        reference_token=3,
        logprob_gap=4.0,
        near_tie=False,
        locate_note=note,
    )
    lines = explain("==", Verdict(row, RUNS), "PASS")
    assert lines is not None
    quoted = lines[2]
    assert quoted.startswith("module search: every one of 32 module outputs was inside the tolerance on the rerun: ")
    assert quoted.endswith(" …") and len(quoted) <= len("module search: ") + 122
    assert lines[-1] == f"run.py, result.json and log.txt: {RUNS}" and sum(map(len, lines)) < 640
    short = Row(model_id="org/m", result="FAIL", failure_stage="parity", locate_note="not searched: a short reason")
    assert "module search: not searched: a short reason" in (explain("==", Verdict(short, RUNS), "PASS") or [])
