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
    tokens = decide.repeat_differs([1, 2, 3], [1, 9, 3], 1)
    assert (tokens.result, tokens.failure_stage, tokens.verdict_basis) == ("FAIL", "generate", "repeat")
    assert tokens.error == "the warm second generate() differs from the first at position 1 of 3 (first 2, second 9)"
    vectors = decide.repeat_differs((), None, None, outputs="embeddings")
    assert vectors.error is not None and "embeddings differ" in vectors.error
    image = decide.repeat_differs((), None, None, outputs="image")
    assert (image.result, image.failure_stage, image.verdict_basis) == ("FAIL", "generate", "repeat")
    assert image.error == "the warm second pipeline call's image differs from the first's"


def test_the_pipeline_verdict_is_the_stages_rule_or_an_error_saying_why_it_could_not_be_checked() -> None:
    from pytest_neuron_support.verdict.tolerance import MULTIPLE, calibrated

    healthy = calibrated([{"stage": "denoise", "step": 0, "distance": 0.004, "noise": 0.004}])
    assert decide.pipeline_stages(healthy, "ran", None) == decide.passed(decide.PIPELINE_BASIS)
    off = calibrated([{"stage": "decode", "step": 0, "distance": 0.004 * (MULTIPLE + 1), "noise": 0.004}])
    failed = decide.pipeline_stages(off, "ran", None)
    assert (failed.result, failed.failure_stage, failed.verdict_basis) == ("FAIL", "parity", decide.PIPELINE_BASIS)
    assert failed.error is not None and failed.error.startswith("teacher-forced pipeline check: decode at step 0")
    # A check that did not finish, or could not run, decides nothing about the numbers: an ERROR saying why.
    crashed = decide.pipeline_stages(None, "ran", ("TIMEOUT", "the check run.py timed out"))
    assert (crashed.result, crashed.failure_stage, crashed.error) == (
        "TIMEOUT",
        "reference",
        "the check run.py timed out",
    )
    skipped = decide.pipeline_stages(None, "skipped: needs ~9.0 GiB of host memory", None)
    assert (skipped.result, skipped.failure_stage) == ("ERROR", "reference")
    assert skipped.error == "the pipeline check cannot run: needs ~9.0 GiB of host memory"


def test_a_run_that_did_not_finish_is_decided_by_the_run_at_its_stage() -> None:
    assert decide.run_failed("TIMEOUT", "compile", "x").fields() == {
        "result": "TIMEOUT",
        "failure_stage": "compile",
        "verdict_basis": "run",
        "error": "x",
    }


def test_the_calibrated_rule_judges_each_distance_against_the_dtypes_own_noise() -> None:
    from pytest_neuron_support.verdict.images import psnr
    from pytest_neuron_support.verdict.tolerance import FLOOR, MULTIPLE, calibrated, row_fields

    def score(stage: str, step: int, distance: float, noise: float) -> dict[str, object]:
        return {"stage": stage, "step": step, "distance": distance, "noise": noise}

    # bf16-sized noise: a device as far from float32 as the CPU's own bf16 is, or a little further, passes.
    healthy = [score("denoise", i, 0.007, 0.009) for i in range(3)] + [score("scheduler", 0, 0.0028, 0.0028)]
    good = calibrated(healthy, {"denoise": 3, "scheduler": 1})
    assert good.match and good.closest is not None and good.closest.ratio == 1.0
    assert decide.numeric(good, "pipeline-teacher-forced", "check") == decide.Decision(
        "PASS", None, "pipeline-teacher-forced", None
    )
    fields = row_fields(good)
    assert fields["evidence_stage"] == "scheduler" and fields["noise_ratio"] == 1.0 and fields["reference_match"]
    assert fields["numeric_stages"] == ("denoise[0]", "denoise[1]", "denoise[2]", "scheduler[0]")
    # The multiple is inclusive, and the floor holds a stage whose own noise is tiny (a float32 run).
    assert calibrated([score("decode", 0, MULTIPLE * 0.01, 0.01)]).match
    assert calibrated([score("decode", 0, MULTIPLE * FLOOR, 0.0)]).match
    assert not calibrated([score("decode", 0, MULTIPLE * FLOOR * 1.01, 0.0)]).match
    # The same distance that passes a noisy stage fails a quiet one: no one constant for every output.
    assert calibrated([score("denoise", 0, 0.02, 0.009)]).match
    assert not calibrated([score("scheduler", 0, 0.02, 0.0028)]).match
    # The first comparison out of tolerance, in order, is named with its stage, step and ratio.
    planted = calibrated([*healthy[:2], score("denoise", 2, 0.5, 0.0056), score("scheduler", 0, 0.3, 0.0028)])
    assert planted.first_bad is not None and planted.first_bad.label == "denoise[2]"
    failed = decide.numeric(planted, "pipeline-teacher-forced", "teacher-forced pipeline check")
    assert (failed.result, failed.failure_stage, failed.verdict_basis) == ("FAIL", "parity", "pipeline-teacher-forced")
    assert failed.error == (
        "teacher-forced pipeline check: denoise at step 2: relative distance from float32 0.5 is 89.3x the dtype's "
        "own noise 0.0056 (at most 3x); 1 later comparison(s) out of tolerance too"
    )
    assert row_fields(planted)["noise_ratio"] == 89.2857 and not row_fields(planted)["reference_match"]
    # A non-finite distance never passes; nor does a check that scored fewer calls than the device made.
    assert not calibrated([score("decode", 0, math.nan, 0.01)]).match
    assert not calibrated([score("decode", 0, math.inf, 0.01)]).match
    # Nor does any distance when the CPU's own run in the device's dtype gave no finite output (an fp16 VAE
    # that overflows on the CPU): there is no noise to judge it against.
    for noise in (math.nan, math.inf, None):
        assert not calibrated([score("decode", 0, 0.0, noise)]).match  # type: ignore[arg-type]
    short = decide.numeric(calibrated(healthy[:2], {"denoise": 3, "scheduler": 1}), "b", "check")
    assert short.result == "FAIL" and "denoise 2 of 3, scheduler 0 of 1" in (short.error or "")
    assert decide.numeric(calibrated([]), "b", "check").result == "FAIL"
    # PSNR of 8-bit images: identical is the cap, one value off by 255 in a 4-pixel image is 10*log10(4).
    assert psnr([1, 2, 3, 4], [1, 2, 3, 4]) == 100.0
    assert psnr([0, 0, 0, 0], [255, 0, 0, 0]) == round(10 * math.log10(4), 3)
    assert psnr([1, 2], [1, 2, 3]) is None


def test_a_text_to_image_pipeline_fails_placement_with_any_component_off_the_device() -> None:
    assert decide.component_placement("neuron", {"unet": ["neuron"], "vae": ["neuron"]}) is None
    off = decide.component_placement("neuron", {"unet": ["neuron"], "text_encoder": ["cpu", "neuron"]})
    assert off is not None and (off.result, off.failure_stage, off.verdict_basis) == ("FAIL", "load", "placement")
    assert off.error == "pipeline components not wholly on 'neuron': text_encoder on cpu, neuron"


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
