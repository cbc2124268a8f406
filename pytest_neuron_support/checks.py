"""Verdicts: does the device output match the CPU reference?

PASS (``exact`` parity, the seed's meaning) needs every generated token equal. Whatever the
verdict, the evidence is kept: matched prefix, first divergence, both tokens and their
logprob gap, so a reader can tell a near-tie from a broken model (``shared/reference/
verdicts.md``: a divergence at token 0 means broken, late drift means numerics).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Parity:
    """Token-level comparison of a device run with its CPU reference.

    Attributes:
        match: all tokens equal and the same count.
        matched_prefix: leading tokens that agree.
        first_divergence: index of the first disagreement (a length difference counts), or None.
        device_token / reference_token: the two tokens there (None past a sequence's end).
        logprob_gap: at the divergence, the reference's logprob of its own token minus its
            logprob of the device token (nats, >= 0); from the device's distribution when the
            reference's top-k does not hold the device token; None if neither has both.
    """

    match: bool
    matched_prefix: int
    first_divergence: int | None
    device_token: int | None
    reference_token: int | None
    logprob_gap: float | None


def _logprob(position: Mapping[str, Any] | None, token: int) -> float | None:
    if position is None:
        return None
    ids: Sequence[int] = position.get("ids", ())
    if token in ids:
        return float(position["logprobs"][list(ids).index(token)])
    return None


def _at(top: Sequence[Mapping[str, Any]], index: int) -> Mapping[str, Any] | None:
    return top[index] if index < len(top) else None


def compare(
    device_tokens: Sequence[int],
    reference_tokens: Sequence[int],
    device_top: Sequence[Mapping[str, Any]] = (),
    reference_top: Sequence[Mapping[str, Any]] = (),
) -> Parity:
    """Compare two greedy generations token by token."""
    prefix = 0
    for a, b in zip(device_tokens, reference_tokens, strict=False):
        if a != b:
            break
        prefix += 1
    if prefix == len(device_tokens) == len(reference_tokens):
        return Parity(True, prefix, None, None, None, None)
    dev = device_tokens[prefix] if prefix < len(device_tokens) else None
    ref = reference_tokens[prefix] if prefix < len(reference_tokens) else None
    gap: float | None = None
    if dev is not None and ref is not None:
        ref_pos = _at(reference_top, prefix)
        own, other = _logprob(ref_pos, ref), _logprob(ref_pos, dev)
        if own is None or other is None:
            dev_pos = _at(device_top, prefix)
            own, other = _logprob(dev_pos, ref), _logprob(dev_pos, dev)
            if own is not None and other is not None:
                own, other = other, own  # device's view: its token minus the reference token
        if own is not None and other is not None:
            gap = round(own - other, 6)
    return Parity(False, prefix, prefix, dev, ref, gap)
