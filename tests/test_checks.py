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


def test_gap_falls_back_to_the_device_distribution() -> None:
    ref_top = [pos([5, 6], [-0.1, -0.2])]  # device token 8 is not in the reference's top-k
    dev_top = [pos([8, 5], [-0.3, -1.3])]
    parity = compare([8], [5], dev_top, ref_top)
    assert parity.first_divergence == 0 and parity.logprob_gap == 1.0


def test_gap_unknown_when_neither_distribution_holds_both_tokens() -> None:
    parity = compare([8], [5], [pos([8], [-0.1])], [pos([5], [-0.1])])
    assert parity.first_divergence == 0 and parity.logprob_gap is None


def test_length_difference_is_a_divergence() -> None:
    parity = compare([1, 2], [1, 2, 3])
    assert not parity.match and parity.first_divergence == 2
    assert parity.device_token is None and parity.reference_token == 3
