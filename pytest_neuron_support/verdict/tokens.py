"""Token evidence: does the device's text match the CPU model's, and where not, how close was it?

PASS (``exact`` parity, the seed's meaning) needs every generated token equal. Whatever the
verdict, the evidence is kept: matched prefix, first divergence, both tokens and their
logprob gap, so a reader can tell a near-tie from a broken model (``shared/reference/
verdicts.md``: a divergence at token 0 means broken, late drift means numerics).

Every generation run also gets a **teacher-forced** check (:func:`teacher_forced`): one CPU forward
over the prompt plus the device's own tokens scores each position under the device's prefix, so a
one-off near-tie is told from a broken model at every position, not only up to the first
divergence, and a sharded run's tokens are checked for what they are, not for how fluent they read.

Pure functions of plain data: the controller never imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PARITY_MODES: tuple[str, ...] = ("exact", "near-tie")
#: Near-tie rule (vLLM's check_logprobs_close, tightened with a gap as peers do): at the first
#: divergence each run's token is in the other's top-N, and they are at most this far apart.
NEAR_TIE_TOP_N = 5
NEAR_TIE_MAX_GAP = 0.5  # nats: bf16 resolution near typical logprobs is a few hundredths


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
        near_tie: at the first divergence each token is in the other run's top-5 and the gap is
            at most 0.5 nats (numeric drift); None when the runs agree.
    """

    match: bool
    matched_prefix: int
    first_divergence: int | None
    device_token: int | None
    reference_token: int | None
    logprob_gap: float | None
    near_tie: bool | None = None


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
        return Parity(True, prefix, None, None, None, None, None)
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
    near_tie = (
        dev is not None
        and ref is not None
        and gap is not None
        and gap <= NEAR_TIE_MAX_GAP
        and _in_top(_at(reference_top, prefix), dev)
        and _in_top(_at(device_top, prefix), ref)
    )
    return Parity(False, prefix, prefix, dev, ref, gap, near_tie)


def _in_top(position: Mapping[str, Any] | None, token: int) -> bool:
    return position is not None and token in list(position.get("ids", ()))[:NEAR_TIE_TOP_N]


@dataclass(frozen=True)
class TeacherForced:
    """The device's tokens scored by the CPU model under the device's own prefix.

    Attributes:
        positions_checked: device tokens scored.
        positions_disagreeing: positions whose device token is not the CPU top-1.
        first_disagreement: index of the first such position, or None.
        device_token / cpu_token: the device's token and the CPU top-1 there.
        rank: the device token's rank in the CPU distribution there (0 = top-1).
        deficit: CPU logprob of its top-1 minus that of the device token there (nats).
        max_deficit: the largest deficit over all positions (0.0 when all agree).
        all_near_ties: every disagreement is a near-tie (:func:`is_forced_near_tie`); None when
            none disagree.
    """

    positions_checked: int
    positions_disagreeing: int
    first_disagreement: int | None
    device_token: int | None
    cpu_token: int | None
    rank: int | None
    deficit: float | None
    max_deficit: float
    all_near_ties: bool | None

    def passes(self, parity: str) -> bool:
        """``exact``: every device token is the CPU top-1; ``near-tie``: every miss is a near-tie."""
        if self.positions_checked == 0:
            return False
        if self.positions_disagreeing == 0:
            return True
        return parity == "near-tie" and bool(self.all_near_ties)


def is_forced_near_tie(position: Mapping[str, Any], device_top: Mapping[str, Any] | None) -> bool:
    """The near-tie rule of a teacher-forced disagreement, the free-running rule made symmetric at
    one position under one prefix: the device token is in the CPU's top-5, the CPU top-1 is in the
    device's top-5 at that position (when the device recorded it), and the CPU's logprob of the
    device token is at most 0.5 nats below its top-1."""
    if int(position["rank"]) >= NEAR_TIE_TOP_N or float(position["deficit"]) > NEAR_TIE_MAX_GAP:
        return False
    return device_top is None or _in_top(device_top, int(position["top1"]))


def teacher_forced(
    positions: Sequence[Mapping[str, Any]], device_top: Sequence[Mapping[str, Any]] = ()
) -> TeacherForced:
    """Summarise run.py's teacher-forced positions (``token``, ``top1``, ``rank``, ``deficit``
    per position); ``device_top`` is the device run's own top-k per position, under the same prefix."""
    misses = [i for i, p in enumerate(positions) if int(p["rank"]) != 0]
    max_deficit = max((float(p["deficit"]) for p in positions), default=0.0)
    if not misses:
        return TeacherForced(len(positions), 0, None, None, None, None, None, round(max_deficit, 6), None)
    first = positions[misses[0]]
    near = all(is_forced_near_tie(positions[i], _at(device_top, i)) for i in misses)
    return TeacherForced(
        positions_checked=len(positions),
        positions_disagreeing=len(misses),
        first_disagreement=misses[0],
        device_token=int(first["token"]),
        cpu_token=int(first["top1"]),
        rank=int(first["rank"]),
        deficit=round(float(first["deficit"]), 6),
        max_deficit=round(max_deficit, 6),
        all_near_ties=near,
    )


def repeat_divergence(first: Sequence[int], second: Sequence[int]) -> int | None:
    """Where the warm second generation parts from the first (a length difference counts), or None."""
    for index, (a, b) in enumerate(zip(first, second, strict=False)):
        if a != b:
            return index
    return None if len(first) == len(second) else min(len(first), len(second))
