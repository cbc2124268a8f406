"""The verdict rule's one home (verdict/decide.py): each decision from planted evidence, with the result,
the stage, the basis and an error that names where and by how much."""

from __future__ import annotations

import math

import pytest

from pytest_neuron_support.verdict import decide
from pytest_neuron_support.verdict.embeddings import compare_embeddings
from pytest_neuron_support.verdict.tokens import compare, teacher_forced
from pytest_neuron_support.verdict.training import compare_training


def scored(ranks: list[int], deficit: float = 2.0) -> list[dict[str, object]]:
    """Teacher-forced positions: token 10 + i, the CPU's top-1 the same unless its rank says otherwise."""
    return [
        {"token": 10 + i, "top1": 10 + i if rank == 0 else 99, "rank": rank, "deficit": 0.0 if rank == 0 else deficit}
        for i, rank in enumerate(ranks)
    ]


def test_one_core_passes_only_when_both_parity_and_the_teacher_forced_check_hold() -> None:
    same = compare([1, 2, 3], [1, 2, 3])
    clean = teacher_forced(scored([0, 0, 0]))
    assert decide.one_core(same, clean, "exact", 3, 3) == decide.Decision("PASS", None, "parity+teacher-forced", None)
    # A planted divergence at token 1: parity fails, naming the index and both tokens.
    differs = compare([1, 5, 3], [1, 2, 3])
    failed = decide.one_core(differs, clean, "exact", 3, 3)
    assert (failed.result, failed.failure_stage, failed.verdict_basis) == ("FAIL", "parity", "parity+teacher-forced")
    assert failed.error is not None and "index 1 of 3 (device 5, reference 2" in failed.error
    # A planted miss in the CPU check alone: the teacher-forced part names its position and deficit.
    missed = decide.one_core(same, teacher_forced(scored([0, 0, 3], deficit=4.5)), "exact", 3, 3)
    assert missed.result == "FAIL" and missed.error is not None
    assert "first at position 2 of 3" in missed.error and "4.5 nats below" in missed.error


def test_near_tie_mode_passes_a_near_tie_and_exact_mode_does_not() -> None:
    top = [{"ids": [2, 5], "logprobs": [-0.1, -0.2]}] * 2
    tie = compare([1, 5], [1, 2], top, top)
    assert tie.near_tie
    near = teacher_forced(
        [{"token": 1, "top1": 1, "rank": 0, "deficit": 0.0}, {"token": 5, "top1": 2, "rank": 1, "deficit": 0.1}]
    )
    assert decide.one_core(tie, near, "near-tie", 2, 2).result == "PASS"
    assert decide.one_core(tie, near, "exact", 2, 2).result == "FAIL"


def test_a_sharded_run_is_decided_teacher_forced_and_by_the_judge_only_without_it() -> None:
    clean, broken = teacher_forced(scored([0, 0])), teacher_forced(scored([1, 0]))
    not_fluent = decide.judge_failed("FAIL", "not fluent")
    # The teacher-forced check decides even when the judge disagrees with it.
    assert decide.sharded(clean, not_fluent, "exact", 2) == decide.Decision("PASS", None, "teacher-forced", None)
    failed = decide.sharded(broken, None, "exact", 2)
    assert (failed.result, failed.failure_stage, failed.verdict_basis) == ("FAIL", "parity", "teacher-forced")
    # Without the CPU check (the host cannot hold the model) the judge decides alone.
    assert decide.sharded(None, not_fluent, "exact", 2) == decide.Decision("FAIL", "judge", "judge", "not fluent")
    assert decide.sharded(None, None, "exact", 2).verdict_basis == "judge"
    # A check that scored nothing is no PASS.
    nothing = decide.sharded(teacher_forced([]), None, "exact", 0)
    assert nothing.result == "FAIL" and nothing.error is not None and "scored no token" in nothing.error


def test_embeddings_pass_at_the_threshold_and_fail_below_it_naming_the_sentence() -> None:
    good = compare_embeddings([[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [0.0, 1.0]], 0.999)
    assert decide.embeddings(good) == decide.Decision("PASS", None, "cosine", None)
    bad = decide.embeddings(compare_embeddings([[1.0, 0.0], [1.0, 1.0]], [[1.0, 0.0], [0.0, 1.0]], 0.999))
    assert (bad.result, bad.failure_stage, bad.verdict_basis) == ("FAIL", "parity", "cosine")
    assert bad.error is not None and "(sentence 1)" in bad.error and "0.999" in bad.error
    uncomparable = decide.embeddings(compare_embeddings([[1.0]], [[1.0], [2.0]], 0.999))
    assert (
        uncomparable.result == "FAIL" and uncomparable.error is not None and "cannot be compared" in uncomparable.error
    )


@pytest.mark.parametrize(
    ("device", "what"),
    [([2.0, 2.5, 1.5], "loss"), ([2.0, math.nan, 1.5], "loss not finite"), ([2.0, 1.8], "step count")],
)
def test_training_fails_at_the_first_step_that_went_wrong(device: list[float], what: str) -> None:
    cpu = [2.0, 1.8, 1.6]
    assert decide.training(compare_training(cpu, cpu), 0).result == "PASS"
    failed = decide.training(compare_training(device, cpu), 0)
    assert (failed.result, failed.failure_stage, failed.verdict_basis) == ("FAIL", "train", "train-losses")
    assert failed.error is not None
    assert ("step 2" in failed.error) if what != "step count" else ("ran 2 step(s)" in failed.error)
    recompiled = decide.training(compare_training(cpu, cpu), 2)
    assert (
        recompiled.result == "FAIL" and recompiled.error is not None and "2 graph(s) compiled again" in recompiled.error
    )


def test_a_warm_run_that_differs_fails_at_generate_saying_where() -> None:
    tokens = decide.repeat_differs([1, 2, 3], [1, 9, 3], 1, vectors=False)
    assert (tokens.result, tokens.failure_stage, tokens.verdict_basis) == ("FAIL", "generate", "repeat")
    assert tokens.error == "the warm second generate() differs from the first at position 1 of 3 (first 2, second 9)"
    vectors = decide.repeat_differs((), None, None, vectors=True)
    assert vectors.error is not None and "embeddings differ" in vectors.error


def test_a_run_that_did_not_finish_is_decided_by_the_run_at_its_stage() -> None:
    assert decide.run_failed("TIMEOUT", "compile", "x").fields() == {
        "result": "TIMEOUT",
        "failure_stage": "compile",
        "verdict_basis": "run",
        "error": "x",
    }


def test_denoising_passes_within_tolerance_and_fails_at_the_first_step_out_of_it() -> None:
    from pytest_neuron_support.verdict.denoising import MAX_REL_ERROR, MIN_COSINE, denoising, psnr

    healthy = [{"rel_error": 0.01, "cosine": 0.9999}] * 5
    assert decide.denoised(denoising(healthy, 5)) == decide.Decision("PASS", None, "denoise-teacher-forced", None)
    # A step off by its size (relative error), and one pointing elsewhere (cosine): each caught alone.
    for bad in ({"rel_error": 0.5, "cosine": 0.99998}, {"rel_error": 0.01, "cosine": 0.9}):
        steps = [*healthy[:3], bad, healthy[4]]
        checked = denoising(steps, 5)
        assert checked.first_bad_step == 3 and not checked.match
        failed = decide.denoised(checked)
        assert (failed.result, failed.failure_stage, failed.verdict_basis) == (
            "FAIL",
            "parity",
            "denoise-teacher-forced",
        )
        assert failed.error is not None and "step 3 of 5 is out of tolerance" in failed.error
    edge = [{"rel_error": MAX_REL_ERROR, "cosine": MIN_COSINE}]
    assert denoising(edge, 1).match  # the tolerances are inclusive
    nan = denoising([{"rel_error": math.nan, "cosine": 1.0}], 1)
    assert nan.first_bad_step == 0
    # A CPU check that scored fewer calls than the device made is no PASS.
    short = decide.denoised(denoising(healthy[:4], 5))
    assert (
        short.result == "FAIL"
        and short.error is not None
        and "scored 4 denoiser call(s) of the device run's 5" in short.error
    )
    assert decide.denoised(denoising([], 0)).result == "FAIL"
    # PSNR of 8-bit images: identical is the cap, one value off by 255 in a 4-pixel image is 10*log10(4).
    assert psnr([1, 2, 3, 4], [1, 2, 3, 4]) == 100.0
    assert psnr([0, 0, 0, 0], [255, 0, 0, 0]) == round(10 * math.log10(4), 3)
    assert psnr([1, 2], [1, 2, 3]) is None


def test_a_pipeline_passes_placement_only_with_the_whole_model_on_the_asked_device() -> None:
    assert decide.placement("neuron", ["neuron"], "neuron:0") is None
    assert decide.placement("cuda:0", ["cuda"], "cuda:0") is None  # an index names the same device type
    stayed = decide.placement("neuron", ["cpu"], "cpu")
    assert stayed is not None
    assert (stayed.result, stayed.failure_stage, stayed.verdict_basis) == ("FAIL", "load", "placement")
    assert stayed.error is not None and stayed.error.startswith("the pipeline's model stayed on cpu, not on neuron")
    # Partly offloaded (Accelerate's device_map="auto" spilling to the CPU): not on the device either.
    split = decide.placement("cuda", ["cpu", "cuda"], "cuda:0")
    assert split is not None and "is on cpu, cuda, not on cuda" in (split.error or "")
    nothing = decide.placement("neuron", [], None)
    assert nothing is not None and "no device (nothing recorded)" in (nothing.error or "")
