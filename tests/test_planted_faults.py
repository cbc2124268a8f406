"""The planted-fault table (benchmarks/faults.py) stays well-formed, the plumbing that plants it (the
sessions' conftest, the runscript check) works, and the benchmark's oracle counts a fault as caught only
as a FAIL at its stage with its evidence (an ERROR, a TIMEOUT or a row that never ran is a broken fault):
on made-up rows for every outcome, and on the real row of one kind run end to end."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_neuron_support import zoo
from pytest_neuron_support.devices.table import DEVICES
from pytest_neuron_support.run.runscript import RunSpec, render

# benchmarks/ is a directory of scripts, not a package: import from it as the benchmarks themselves do.
BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

import faults  # noqa: E402
import planted_faults  # noqa: E402


@pytest.mark.parametrize("kind", list(faults.FAULTS))
def test_every_kind_is_described_classified_and_compiles(kind: str) -> None:
    fault = faults.FAULTS[kind]
    assert fault.description.strip(), kind
    assert fault.expected in (faults.FAULT, faults.HEALTHY), kind
    assert fault.applies_to in faults.APPLIES_TO, kind
    compile(fault.source, kind, "exec")


def test_the_corpus_has_enough_faults_and_a_healthy_stand_in() -> None:
    expected = [fault.expected for fault in faults.FAULTS.values()]
    assert expected.count(faults.FAULT) >= 7
    assert expected.count(faults.HEALTHY) >= 1


def test_a_one_rank_fault_applies_to_sharded_entries_only() -> None:
    one_rank = [kind for kind, fault in faults.FAULTS.items() if 'os.environ.get("RANK")' in fault.source]
    assert one_rank, "no fault acts on one rank of a sharded run"
    for kind in one_rank:
        fault = faults.FAULTS[kind]
        assert fault.applies_to == faults.SHARDED, kind
        assert not faults.applies(fault, None) and not faults.applies(fault, 1), kind
        assert faults.applies(fault, 2) and faults.applies(fault, 4), kind


def test_the_sessions_conftest_returns_the_named_kinds_source(monkeypatch: pytest.MonkeyPatch) -> None:
    namespace: dict[str, object] = {}
    exec(compile(faults.conftest(str(BENCH)), "conftest.py", "exec"), namespace)
    hook = namespace["pytest_neuron_support_post_load"]
    assert callable(hook)
    sharded_kind = next(kind for kind, fault in faults.FAULTS.items() if fault.applies_to == faults.SHARDED)
    monkeypatch.setenv(faults.ENV_VAR, sharded_kind)
    assert hook(None, SimpleNamespace(cores=2)) == faults.FAULTS[sharded_kind].source
    assert hook(None, SimpleNamespace(cores=None)) is None  # not planted into a single-process entry
    monkeypatch.setenv(faults.ENV_VAR, "dead-layer")
    assert hook(None, SimpleNamespace(cores=None)) == faults.FAULTS["dead-layer"].source


def test_the_benchmark_reads_the_planted_source_back_from_run_py() -> None:
    source = faults.FAULTS["embedding-rows-swapped"].source
    spec = RunSpec(
        model="tiny-random/qwen3",
        revision="main",
        task="text-generation",
        dtype="bfloat16",
        prompt=zoo.TINY_PROMPT,
        max_new_tokens=32,
        device=DEVICES["cpu"],
        compile=True,
        compile_backend="inductor",
        post_load=source,
    )
    assert planted_faults.planted_source(render(spec)) == source


def test_the_benchmark_runs_the_generation_entries_only() -> None:
    entries = planted_faults.generation_entries()
    ids = [entry["id"] for entry in entries]
    assert "tiny-random/llava" in ids and "sentence-transformers/all-MiniLM-L6-v2" not in ids
    assert any((entry.get("cores") or 1) > 1 for entry in entries)  # the one-rank fault has entries to run on


# --- The oracle: a fault is caught only as a FAIL at its stage with its evidence ----------------------


def _runscript(source: str) -> str:
    spec = RunSpec(
        model="tiny-random/qwen3",
        revision="main",
        task="text-generation",
        dtype="bfloat16",
        prompt=zoo.TINY_PROMPT,
        max_new_tokens=32,
        device=DEVICES["cpu"],
        compile=True,
        compile_backend="inductor",
        post_load=source,
    )
    return render(spec)


def _row(kind: str, **fields: object) -> dict[str, object]:
    """A row of ``kind`` planted into tiny-random/qwen3 that the harness FAILed at parity, its first
    teacher-forced disagreement at position 4; ``fields`` override."""
    row: dict[str, object] = {
        "model_id": "tiny-random/qwen3",
        "result": "FAIL",
        "failure_stage": "parity",
        "verdict_basis": "parity+teacher-forced",
        "error": "teacher-forced CPU check: 1 of 32 device tokens are not the CPU top-1; first at position 4 of 32",
        "runscript": _runscript(faults.FAULTS[kind].source),
        "positions_disagreeing": 1,
        "first_disagreement": 4,
        "repeat_divergence": None,
    }
    return {**row, **fields}


def _judged(kind: str, row: dict[str, object] | None) -> tuple[str, str]:
    judged = planted_faults.judge(faults.FAULTS[kind], "tiny-random/qwen3", row)
    return judged.outcome, judged.why


def test_a_fail_at_the_kinds_stage_with_its_evidence_is_caught() -> None:
    assert _judged("second-best-once", _row("second-best-once")) == (planted_faults.CAUGHT, "FAIL@parity at position 4")
    # A kind that fixes no position: any teacher-forced disagreement at parity is its evidence.
    outcome, _ = _judged("dead-layer", _row("dead-layer", first_disagreement=0, positions_disagreeing=9))
    assert outcome == planted_faults.CAUGHT
    warm = _row(
        "warm-run-second-best",
        failure_stage="generate",
        verdict_basis="repeat",
        repeat_divergence=4,
        positions_disagreeing=None,
        first_disagreement=None,
    )
    assert _judged("warm-run-second-best", warm) == (planted_faults.CAUGHT, "FAIL@generate at position 4")


@pytest.mark.parametrize(
    ("result", "stage"), [("ERROR", "load"), ("ERROR", "reference"), ("TIMEOUT", "generate"), ("SKIPPED", "plan")]
)
def test_a_row_without_a_verdict_is_a_broken_fault_never_a_catch(result: str, stage: str) -> None:
    row = _row("second-best-once", result=result, failure_stage=stage, error="RuntimeError: boom in the fault")
    outcome, why = _judged("second-best-once", row)
    assert outcome == planted_faults.BROKEN
    assert why.startswith(f"{result}@{stage}, no verdict") and "boom in the fault" in why, why


def test_no_row_or_a_run_py_without_the_planted_source_is_a_broken_fault() -> None:
    assert _judged("second-best-once", None)[0] == planted_faults.BROKEN
    # The harness FAILed it, but what ran was not the planted source (here: another kind's).
    other = _row("second-best-once", runscript=_runscript(faults.FAULTS["dead-layer"].source))
    outcome, why = _judged("second-best-once", other)
    assert outcome == planted_faults.BROKEN and "does not carry the planted source" in why
    assert _judged("second-best-once", _row("second-best-once", runscript=None))[0] == planted_faults.BROKEN


def test_a_pass_or_a_fail_elsewhere_or_without_the_evidence_is_missed() -> None:
    missed = planted_faults.MISSED
    passed = _row("second-best-once", result="PASS", failure_stage=None, error=None, positions_disagreeing=0)
    assert _judged("second-best-once", passed) == (missed, "PASS: the harness accepted the planted fault")
    outcome, why = _judged("second-best-once", _row("second-best-once", failure_stage="judge"))
    assert outcome == missed and why.startswith("FAIL@judge, not at stage parity"), why
    # A FAIL at parity whose disagreement is not the planted one: something else failed it.
    outcome, why = _judged("second-best-once", _row("second-best-once", first_disagreement=2))
    assert outcome == missed and "at position 2, not at the planted 4" in why, why
    outcome, why = _judged("dead-layer", _row("dead-layer", positions_disagreeing=0, first_disagreement=None))
    assert outcome == missed and "no disagreeing position" in why, why
    # The warm-run kind FAILing at parity means the first run was not healthy: not this fault's catch.
    assert _judged("warm-run-second-best", _row("warm-run-second-best"))[0] == missed
    off = _row("warm-run-second-best", failure_stage="generate", verdict_basis="repeat", repeat_divergence=7)
    outcome, why = _judged("warm-run-second-best", off)
    assert outcome == missed and "diverges at position 7, not at the planted 4" in why, why


def test_a_healthy_kind_must_pass_and_its_broken_rows_are_broken() -> None:
    passed = _row("no-op", result="PASS", failure_stage=None, error=None, positions_disagreeing=0)
    assert _judged("no-op", passed) == (planted_faults.ACCEPTED, "PASS")
    outcome, why = _judged("logit-jitter", _row("logit-jitter"))
    assert outcome == planted_faults.FALSE_FAIL and why.startswith("FAIL@parity: teacher-forced"), why
    assert _judged("no-op", _row("no-op", result="ERROR", failure_stage="load"))[0] == planted_faults.BROKEN


def test_an_outcome_with_a_broken_fault_is_not_ok() -> None:
    fault = faults.FAULTS["second-best-once"]
    caught = planted_faults.judge(fault, "tiny-random/qwen3", _row("second-best-once"))
    broken = planted_faults.judge(fault, "tiny-random/llama", _row("second-best-once", result="ERROR"))
    good = planted_faults.Outcome("second-best-once", ["tiny-random/qwen3"], judgements=[caught])
    bad = planted_faults.Outcome(
        "second-best-once", ["tiny-random/qwen3", "tiny-random/llama"], judgements=[caught, broken]
    )
    assert good.ok() and not bad.ok() and bad.wrong() == [broken] and bad.count(planted_faults.BROKEN) == 1


@pytest.mark.parametrize("kind", list(faults.FAULTS))
def test_every_fault_kind_names_the_stage_its_evidence_is_read_at(kind: str) -> None:
    fault = faults.FAULTS[kind]
    if fault.expected == faults.HEALTHY:
        assert fault.stage is None and fault.position is None, kind
    else:
        assert fault.stage in ("parity", "generate"), kind
        assert fault.position is None or fault.position >= 0, kind


@pytest.mark.slow
@pytest.mark.usefixtures("eager_compile")
def test_one_planted_kind_runs_end_to_end_and_the_oracle_reads_its_real_row(offline_hub: Path, tmp_path: Path) -> None:
    """The benchmark's own session (its conftest, its catalog entry, its Parquet read-back), for one kind
    on one one-core model, with 8 tokens: the real row is caught at parity at the planted position."""
    kind = "second-best-once"
    [entry] = [entry for entry in planted_faults.generation_entries() if entry["id"] == "tiny-random/qwen3"]
    outcome = planted_faults.run_kind(
        kind, [entry], planted_faults.judge_of(), tmp_path / "work", 0, tmp_path / "cache", ("--max-new-tokens=8",)
    )
    [row] = outcome.rows
    assert outcome.judgements == [
        planted_faults.Judgement("tiny-random/qwen3", planted_faults.CAUGHT, "FAIL@parity at position 4")
    ], (outcome.judgements, row.get("error"))
    assert outcome.ok()
    # What the oracle read is what the fault did: the device's tokens leave the CPU reference's at step 4.
    assert list(row["tokens"])[:4] == list(row["reference_tokens"])[:4] and row["first_divergence"] == 4
    assert row["disagreement_rank"] == 1 and row["verdict_basis"] == "parity+teacher-forced"


def test_a_missing_value_read_back_from_parquet_is_no_evidence() -> None:
    # pandas gives NaN, not None, for a missing number: NaN must not pass for a disagreement.
    row = _row("dead-layer", positions_disagreeing=float("nan"), first_disagreement=float("nan"))
    assert _judged("dead-layer", row)[0] == planted_faults.MISSED
