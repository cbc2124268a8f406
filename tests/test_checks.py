from __future__ import annotations

import math

from pytest_neuron_support.tasks.embedding import EMBEDDING_SENTENCES
from pytest_neuron_support.verdict.embeddings import DEFAULT_MIN_COSINE, EmbeddingParity, compare_embeddings, cosine
from pytest_neuron_support.verdict.tokens import Parity, compare


def pos(ids: list[int], logprobs: list[float]) -> dict[str, object]:
    return {"ids": ids, "logprobs": logprobs, "chosen_logprob": logprobs[0]}


def test_identical_generations_match() -> None:
    assert compare([1, 2, 3], [1, 2, 3]) == Parity(True, 3, None, None, None, None)


def test_divergence_records_prefix_tokens_and_reference_gap() -> None:
    ref_top = [pos([1, 9], [-0.1, -3.0]), pos([2, 7], [-0.5, -0.52]), pos([3], [-0.2])]
    dev_top = [pos([1], [-0.1]), pos([7, 2], [-0.49, -0.51]), pos([4], [-0.2])]
    parity = compare([1, 7, 4], [1, 2, 3], dev_top, ref_top)
    assert not parity.match
    assert parity.matched_prefix == 1 and parity.first_divergence == 1
    assert (parity.device_token, parity.reference_token) == (7, 2)
    assert parity.logprob_gap == 0.02  # reference's view: -0.5 - (-0.52)
    assert parity.near_tie is True  # each token in the other's top-5, 0.02 nats apart


def test_gap_falls_back_to_the_device_distribution() -> None:
    ref_top = [pos([5, 6], [-0.1, -0.2])]  # device token 8 is not in the reference's top-k
    dev_top = [pos([8, 5], [-0.3, -1.3])]
    parity = compare([8], [5], dev_top, ref_top)
    assert parity.first_divergence == 0 and parity.logprob_gap == 1.0
    assert parity.near_tie is False  # not in the reference's top-k, and a whole nat apart


def test_gap_unknown_when_neither_distribution_holds_both_tokens() -> None:
    parity = compare([8], [5], [pos([8], [-0.1])], [pos([5], [-0.1])])
    assert parity.first_divergence == 0 and parity.logprob_gap is None


def test_length_difference_is_a_divergence() -> None:
    parity = compare([1, 2], [1, 2, 3])
    assert not parity.match and parity.first_divergence == 2
    assert parity.device_token is None and parity.reference_token == 3


def test_a_wide_gap_is_not_a_near_tie_even_inside_the_top_five() -> None:
    ref_top = [pos([3, 4, 5, 6, 7], [-0.1, -0.9, -2.0, -3.0, -4.0])]
    dev_top = [pos([4, 3, 5, 6, 7], [-0.2, -0.3, -2.0, -3.0, -4.0])]
    parity = compare([4], [3], dev_top, ref_top)
    assert parity.logprob_gap == 0.8 and parity.near_tie is False
    close = compare([4], [3], dev_top, [pos([3, 4], [-0.5, -0.7])])
    assert close.logprob_gap == 0.2 and close.near_tie is True


def test_top_five_means_five() -> None:
    ref_top = [pos([1, 2, 3, 4, 5, 9], [-1.0, -1.1, -1.2, -1.3, -1.4, -1.45])]  # 9 is sixth
    dev_top = [pos([9, 1], [-1.0, -1.1])]
    parity = compare([9], [1], dev_top, ref_top)
    assert parity.logprob_gap == 0.45 and parity.near_tie is False


def test_fluency_prechecks_on_real_strings() -> None:
    from pytest_neuron_support.verdict.fluency import fluency_precheck

    assert fluency_precheck("", []) == "empty output"
    assert fluency_precheck("   ", [220, 220]) == "empty output"
    assert fluency_precheck("the the the the", [279, 279, 279, 279]) == "one token repeated 4 times (id 279)"
    assert "non-printable" in (fluency_precheck("\x00\x01\x02ab\x03\x04", [1, 2, 3]) or "")
    assert fluency_precheck("The printing press changed Europe.\nBooks spread.", [5, 6, 7]) is None
    assert fluency_precheck("日本語の文章です。", [1, 2]) is None  # printable, not our call to reject


def test_cosine_of_real_vectors() -> None:
    assert cosine([1.0, 0.0], [2.0, 0.0]) == 1.0
    assert cosine([1.0, 0.0], [0.0, 3.0]) == 0.0
    assert math.isclose(cosine([1.0, 1.0], [-1.0, -1.0]), -1.0)
    assert math.isclose(cosine([1.0, 2.0, 3.0], [1.0, 2.0, 3.5]), 15.5 / math.sqrt(14 * 17.25))
    assert cosine([0.0, 0.0], [1.0, 0.0]) == 0.0  # no direction: not similar
    assert math.isnan(cosine([math.nan, 1.0], [1.0, 1.0]))
    assert math.isnan(cosine([1.0, 1.0], [math.inf, 1.0]))


def test_embeddings_pass_at_the_threshold_and_record_the_minimum() -> None:
    assert DEFAULT_MIN_COSINE == 1 - 1e-3
    reference = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.3, 0.4, 0.5]]
    same = compare_embeddings([list(v) for v in reference], reference)
    assert same.match and same.min_cosine is not None and math.isclose(same.min_cosine, 1.0)
    assert same.threshold == DEFAULT_MIN_COSINE
    # Sentence 1 tilted by angle t has cosine cos(t): just above and just below 1 - 1e-3.
    for t, passes in ((math.acos(0.9991), True), (math.acos(0.9989), False)):
        device = [reference[0], [math.sin(t), math.cos(t), 0.0], reference[2]]
        parity = compare_embeddings(device, reference)
        assert parity.match is passes and parity.worst_index == 1
        assert parity.min_cosine is not None and math.isclose(parity.min_cosine, math.cos(t))
        assert len(parity.cosines) == 3 and parity.problem is None
    loose = compare_embeddings([[1.0, 0.1]], [[1.0, 0.0]], threshold=0.99)
    assert loose.match and loose.threshold == 0.99


def test_embeddings_that_cannot_be_compared_fail_with_the_reason() -> None:
    fewer = compare_embeddings([[1.0, 0.0]], [[1.0, 0.0], [0.0, 1.0]])
    assert fewer == EmbeddingParity(
        False, None, None, (), DEFAULT_MIN_COSINE, "1 device embeddings for 2 reference embeddings"
    )
    wider = compare_embeddings([[1.0, 0.0, 0.0]], [[1.0, 0.0]])
    assert not wider.match and wider.problem == "embedding widths differ: [2, 3]"
    assert compare_embeddings([], []).problem is not None
    broken = compare_embeddings([[1.0, 0.0], [math.nan, 0.0]], [[1.0, 0.0], [1.0, 0.0]])
    assert not broken.match and broken.min_cosine is not None and math.isnan(broken.min_cosine)
    assert broken.worst_index == 1


def test_the_embedded_sentences_exercise_padding_and_the_tokenizer() -> None:
    lengths = sorted(len(s.split()) for s in EMBEDDING_SENTENCES)
    assert len(EMBEDDING_SENTENCES) == len(set(EMBEDDING_SENTENCES)) >= 8
    assert lengths[-1] >= 2 * lengths[0]  # a padded batch: the pooling mask matters
    assert any(not s.isascii() for s in EMBEDDING_SENTENCES) and any(
        c.isdigit() for s in EMBEDDING_SENTENCES for c in s
    )


def forced(token: int, top1: int, rank: int, deficit: float, ids: list[int] | None = None) -> dict[str, object]:
    return {"token": token, "top1": top1, "rank": rank, "deficit": deficit, "ids": ids or [top1, token]}


def test_teacher_forced_agreement_passes_in_both_modes() -> None:
    from pytest_neuron_support.verdict.tokens import teacher_forced

    summary = teacher_forced([forced(5, 5, 0, 0.0), forced(6, 6, 0, 0.0)])
    assert (summary.positions_checked, summary.positions_disagreeing, summary.first_disagreement) == (2, 0, None)
    assert summary.max_deficit == 0.0 and summary.all_near_ties is None
    assert summary.passes("exact") and summary.passes("near-tie")


def test_teacher_forced_records_the_first_miss_and_the_worst_one() -> None:
    from pytest_neuron_support.verdict.tokens import teacher_forced

    positions = [forced(5, 5, 0, 0.0), forced(7, 8, 1, 0.03), forced(9, 9, 0, 0.0), forced(4, 3, 12, 6.5)]
    summary = teacher_forced(positions)
    assert (summary.positions_disagreeing, summary.first_disagreement) == (2, 1)
    assert (summary.device_token, summary.cpu_token, summary.rank, summary.deficit) == (7, 8, 1, 0.03)
    assert summary.max_deficit == 6.5
    assert summary.all_near_ties is False  # the second miss is 6.5 nats and 12 ranks down
    assert not summary.passes("exact") and not summary.passes("near-tie")


def test_teacher_forced_near_ties_pass_only_in_near_tie_mode() -> None:
    from pytest_neuron_support.verdict.tokens import teacher_forced

    positions = [forced(5, 5, 0, 0.0), forced(7, 8, 1, 0.03)]
    device_top = [pos([5], [-0.1]), pos([7, 8], [-0.70, -0.72])]  # the CPU top-1 is the device's second
    summary = teacher_forced(positions, device_top)
    assert summary.all_near_ties is True
    assert not summary.passes("exact") and summary.passes("near-tie")
    # The same miss where the device's own top-5 lacks the CPU's top-1 is not a near-tie.
    lopsided = teacher_forced(positions, [pos([5], [-0.1]), pos([7, 1, 2, 3, 4], [-0.1, -2, -3, -4, -5])])
    assert lopsided.all_near_ties is False and not lopsided.passes("near-tie")
    # Past the gap (0.5 nats) or outside the CPU's top-5 it is not one either.
    assert teacher_forced([forced(7, 8, 1, 0.51)]).all_near_ties is False
    assert teacher_forced([forced(7, 8, 5, 0.2)]).all_near_ties is False


def test_teacher_forced_with_nothing_to_score_does_not_pass() -> None:
    from pytest_neuron_support.verdict.tokens import teacher_forced

    summary = teacher_forced([])
    assert summary.positions_checked == 0 and not summary.passes("exact") and not summary.passes("near-tie")


def test_repeat_divergence() -> None:
    from pytest_neuron_support.verdict.tokens import repeat_divergence

    assert repeat_divergence([1, 2, 3], [1, 2, 3]) is None
    assert repeat_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert repeat_divergence([1, 2, 3], [1, 2]) == 2


def test_precheck_sees_special_tokens_the_judge_text_leaves_out() -> None:
    from pytest_neuron_support.verdict.fluency import fluency_precheck

    special, eos = [0, 1, 2], 1
    dead = [285, 349, 381] + [0] * 29  # three words, then the pad token: decoded text is "the quick brown"
    assert fluency_precheck(" the quick brown", dead, special, eos) == (
        "29 of 32 generated tokens are special tokens (first: id 0)"
    )
    # Generation that stops with end-of-sequence is text.
    assert fluency_precheck(" the quick brown", [285, 349, 381, 1], special, eos) is None
    assert fluency_precheck(" the quick", [285, 1, 349, 1], special, eos) is not None  # an eos inside is not


def test_the_training_check_applies_where_the_task_row_says_it_trains() -> None:
    from pytest_neuron_support.checks.registry import KINDS
    from pytest_neuron_support.tasks.generation import TextGeneration
    from pytest_neuron_support.tasks.table import TASKS

    kind = KINDS["train"]
    # train.py fine-tunes a causal LM on text: only text generation's row says it trains.
    assert {name for name, task in TASKS.items() if kind.applies_to(task)} == {"text-generation"}

    class FrozenGeneration(TextGeneration):
        trainable = False

    # The row's attribute decides, not a list kept beside the check.
    assert not kind.applies_to(FrozenGeneration("text-generation"))
