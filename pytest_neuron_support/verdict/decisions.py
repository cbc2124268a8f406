"""Decision evidence of a forward task: does the device decide what the CPU decides, where the CPU is sure?

A forward task (``tasks/forward.py``: text classification, token classification, fill-mask, ...) reads
a decision out of each item of its raw output: the label of a sentence, the tag of a token, the word at a
mask. Each item is a vector of scores (its logits) and its decision is the vector's top-1. The numbers
themselves are judged by the calibrated tolerance rule (``verdict.tolerance``); this module judges the
decisions read from them.

An item's decision is **decisive** when the CPU's float32 margin (top-1 score minus top-2; a one-score
head's distance from 0) is larger than rounding alone can close: more than :data:`~.tolerance.MULTIPLE`
times how far the CPU's own run in the device's dtype moves that margin (:func:`noise_of`: the move it made,
at least the typical move of a difference of two scores, at least :data:`~.tolerance.FLOOR` of the item's
largest score). That is the calibrated rule applied to a margin instead of a distance: no constant
measured on a toy. A device decision that differs where the CPU was decisive is a FAIL; one that differs
at a **near-tie** (a margin rounding can close) is reported in the row, not failed, as the token check
treats a near-tie.

Pure functions of plain data: the controller never imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_neuron_support.verdict.tolerance import FLOOR, MULTIPLE


@dataclass(frozen=True)
class Decisions:
    """Every item's device decision against the CPU's.

    Attributes:
        checked: items compared.
        disagreeing: items whose device top-1 is not the CPU's float32 top-1.
        decisive_disagreeing: those among them where the CPU's margin was decisive (each one FAILs).
        first: the item reported: the first decisive disagreement, else the first near-tie one (None when
            every item agrees).
        device: the device's top-1 at ``first``.
        cpu: the CPU's float32 top-1 at ``first``.
        margin: the CPU's float32 top-1 minus top-2 score at ``first``.
        noise: the most the CPU's own dtype rounding moved a score of ``first`` (at least the floor).
        problem: why the decisions could not be compared (counts or widths differ), else None.
    """

    checked: int
    disagreeing: int
    decisive_disagreeing: int
    first: int | None = None
    device: int | None = None
    cpu: int | None = None
    margin: float | None = None
    noise: float | None = None
    problem: str | None = None

    @property
    def match(self) -> bool:
        """No decisive disagreement and nothing left uncompared."""
        return self.problem is None and self.checked > 0 and self.decisive_disagreeing == 0

    @property
    def near_ties_only(self) -> bool | None:
        """Every disagreement is a near-tie; None when none disagree."""
        return None if not self.disagreeing else self.decisive_disagreeing == 0

    def describe(self, what: str, labels: Sequence[str] = (), cpu_labels: Sequence[str] = ()) -> str:
        """The disagreement in words (``labels``/``cpu_labels``: each item's decision named by each side)."""
        if self.problem is not None:
            return f"{what}: {self.problem}"
        if self.first is None:
            return f"{what}: all {self.checked} decisions agree"
        named = _name(labels, self.first, self.device)
        expected = _name(cpu_labels, self.first, self.cpu)
        kind = "decisive" if self.decisive_disagreeing else "a near-tie"
        return (
            f"{what}: {self.disagreeing} of {self.checked} decisions differ from the CPU's "
            f"({self.decisive_disagreeing} where the CPU was decisive); first at item {self.first}: device {named}, "
            f"CPU {expected}, the CPU's margin {self.margin:.4g} against the dtype's own noise {self.noise:.3g} "
            f"({kind}: decisive above {MULTIPLE:g}x)"
        )


def _name(labels: Sequence[str], index: int, label_id: int | None) -> str:
    name = labels[index] if index < len(labels) else None
    return f"{name!r} ({label_id})" if name is not None else str(label_id)


def finite(scores: Sequence[float]) -> bool:
    return all(math.isfinite(x) for x in scores)


def same_infinities(scores: Sequence[float], reference: Sequence[float]) -> bool:
    """No NaN, and every infinite score is the reference's at the same place (a head that masks a class with
    -inf on both sides is not a fault; a NaN, or an inf the reference does not have, is)."""
    return all(math.isfinite(x) or x == y for x, y in zip(scores, reference, strict=True))


def top_two(scores: Sequence[float]) -> tuple[int, float]:
    """(an item's decision, its lead): the index of the largest score and its lead over the second largest;
    for a one-score head (a reranker, a binary classifier with one logit, which its pipeline reads through a
    sigmoid) whether the score is positive (1) or not (0), leading by its distance from 0. A vector holding
    NaN leads by NaN (nothing about it is decisive); a lead over -inf is inf, and +inf over +inf is NaN."""
    if not scores:
        return 0, math.nan
    if any(math.isnan(x) for x in scores):
        return max(range(len(scores)), key=lambda i: scores[i] if not math.isnan(scores[i]) else -math.inf), math.nan
    if len(scores) == 1:
        return int(scores[0] > 0), abs(scores[0])
    order = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)
    return order[0], scores[order[0]] - scores[order[1]]


def noise_of(float32: Sequence[float], in_dtype: Sequence[float]) -> float:
    """How far the CPU's own dtype rounding can move an item's lead: the larger of how far it moved the
    float32 lead itself (the top-1 minus the top-2, read at the float32 winners) and the typical move of a
    difference of two scores (sqrt(2) x the root-mean-square move of one score), so that a lead that rounding
    happened to leave alone is not taken as exact; at least :data:`FLOOR` of the item's largest finite score.
    Scores infinite alike on both sides (a masked class) are left out; any other NaN or inf makes it inf."""
    if not float32 or not same_infinities(in_dtype, float32) or any(math.isnan(x) for x in float32):
        return math.inf
    kept = [i for i, x in enumerate(float32) if math.isfinite(x)]
    if not kept:
        return math.inf
    moves = {i: in_dtype[i] - float32[i] for i in kept}
    typical = math.sqrt(2.0 * math.fsum(m * m for m in moves.values()) / len(moves))
    order = sorted(kept, key=lambda i: float32[i], reverse=True)
    lead_moved = abs(moves[order[0]] - moves[order[1]]) if len(order) > 1 else abs(moves[order[0]])
    return max(lead_moved, typical, FLOOR * max(abs(float32[i]) for i in kept))


def compare_decisions(
    device: Sequence[Sequence[float]], float32: Sequence[Sequence[float]], in_dtype: Sequence[Sequence[float]]
) -> Decisions:
    """Each item's device top-1 against the CPU's float32 top-1, each disagreement judged decisive or a near-tie
    by the CPU's margin against its own dtype noise (the module's rule)."""
    n = len(float32)
    if not n or len(device) != n or len(in_dtype) != n:
        problem = f"{len(device)} device, {n} float32 and {len(in_dtype)} CPU-dtype items: nothing to pair"
        return Decisions(0, 0, 0, problem=problem)
    widths = {len(v) for v in (*device, *float32, *in_dtype)}
    if len(widths) != 1:
        return Decisions(0, 0, 0, problem=f"item widths differ: {sorted(widths)}")
    disagreeing, decisive = [], []
    facts: dict[int, tuple[int, int, float, float]] = {}
    for i, (d, f, r) in enumerate(zip(device, float32, in_dtype, strict=True)):
        mine, _ = top_two(d)
        theirs, lead = top_two(f)
        if mine == theirs and same_infinities(d, f):
            continue
        noise = noise_of(f, r)
        disagreeing.append(i)
        # A device item holding NaN, or an inf the CPU does not have, never agrees, and that is decisive; a CPU
        # lead over a masked (-inf) class is decisive; where the CPU's own lead or noise is not a number (its
        # float32 or its dtype run overflowed), nothing it decides is decisive.
        if not same_infinities(d, f) or (not math.isnan(lead) and lead > MULTIPLE * noise):
            decisive.append(i)
        facts[i] = (mine, theirs, lead, noise)
    first = decisive[0] if decisive else (disagreeing[0] if disagreeing else None)
    if first is None:
        return Decisions(n, 0, 0)
    mine, theirs, lead, noise = facts[first]
    return Decisions(n, len(disagreeing), len(decisive), first, mine, theirs, lead, noise)
