"""Decision evidence of a forward task: does the device decide what the CPU decides, where the CPU is sure?

A forward task (``tasks/forward.py``: text classification, token classification, fill-mask, ...) reads
a decision out of each item of its raw output: the label of a sentence, the tag of a token, the word at a
mask. Each item is a vector of scores (its logits) and its decision is the vector's top-1. The numbers
themselves are judged by the calibrated tolerance rule (``verdict.tolerance``); this module judges the
decisions read from them.

An item's decision is **decisive** when the CPU's float32 margin (top-1 score minus top-2) is larger
than rounding alone can close: more than :data:`~.tolerance.MULTIPLE` times the largest amount the CPU's
own run in the device's dtype moved any score of that item (at least :data:`~.tolerance.FLOOR` of the
item's largest score). That is the calibrated rule applied to a margin instead of a distance: no constant
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


def top_two(scores: Sequence[float]) -> tuple[int, float]:
    """(the index of the largest score, its lead over the second largest); a lone score leads by inf, and
    a vector holding NaN leads by NaN (nothing about it is decisive)."""
    if not all(math.isfinite(s) for s in scores):
        return (max(range(len(scores)), key=lambda i: scores[i] if math.isfinite(scores[i]) else -math.inf), math.nan)
    order = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)
    lead = scores[order[0]] - scores[order[1]] if len(order) > 1 else math.inf
    return order[0], lead


def noise_of(float32: Sequence[float], in_dtype: Sequence[float]) -> float:
    """The most the CPU's dtype rounding moved one score of an item, at least :data:`FLOOR` of its largest."""
    moved = max((abs(a - b) for a, b in zip(in_dtype, float32, strict=True)), default=0.0)
    scale = max((abs(x) for x in float32), default=0.0)
    return max(moved, FLOOR * scale) if math.isfinite(moved) else math.inf


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
        if mine == theirs and math.isfinite(sum(d)):
            continue
        noise = noise_of(f, r)
        disagreeing.append(i)
        # A device item holding NaN/inf never agrees; a CPU margin that is not a number decides nothing.
        if not math.isfinite(sum(d)) or (math.isfinite(lead) and lead > MULTIPLE * noise) or math.isinf(lead):
            decisive.append(i)
        facts[i] = (mine, theirs, lead, noise)
    first = decisive[0] if decisive else (disagreeing[0] if disagreeing else None)
    if first is None:
        return Decisions(n, 0, 0)
    mine, theirs, lead, noise = facts[first]
    return Decisions(n, len(disagreeing), len(decisive), first, mine, theirs, lead, noise)
