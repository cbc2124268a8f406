from __future__ import annotations

from pytest_neuron_support.checks import Parity, compare


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
    from pytest_neuron_support.checks import fluency_precheck

    assert fluency_precheck("", []) == "empty output"
    assert fluency_precheck("   ", [220, 220]) == "empty output"
    assert fluency_precheck("the the the the", [279, 279, 279, 279]) == "one token repeated 4 times (id 279)"
    assert "non-printable" in (fluency_precheck("\x00\x01\x02ab\x03\x04", [1, 2, 3]) or "")
    assert fluency_precheck("The printing press changed Europe.\nBooks spread.", [5, 6, 7]) is None
    assert fluency_precheck("日本語の文章です。", [1, 2]) is None  # printable, not our call to reject
