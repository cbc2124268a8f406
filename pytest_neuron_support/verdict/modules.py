"""The first diverging module: where, inside the model, a numerics FAIL starts.

After a numerics FAIL the harness reruns one forward at the first bad position (the device's own prefix)
on the device and on CPU with a hook on every module (``cpu.locate``); the CPU side scores each module's
output, in the order the modules finished, with the calibrated tolerance rule's two numbers (the device's
distance from float32, the CPU's own dtype noise). The first module out of tolerance is where the device
first computed wrong: the modules before it were inside, so its inputs were right. Forward hooks fire when
a module finishes, so a leaf (``mlp.down_proj``) comes before the block that holds it (``mlp``, ``layers.1``):
the first one out is the innermost.

Pure functions of plain data: the controller never imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_neuron_support.verdict.tolerance import MULTIPLE, Comparison, calibrated


@dataclass(frozen=True)
class Divergence:
    """The module search's outcome.

    Attributes:
        first: the first module out of tolerance (its ``stage`` is the module's path), None when every module
            was inside or nothing was compared.
        kind: that module's class name.
        last_inside: the last module before it that was inside (None when the very first was out).
        compared: how many module outputs were compared.
        problem: why nothing could be named (nothing compared), else None.
        held: on a sharded run, which rank's part of the first module's output was out and what it was compared
            with (``rank 1, its chunk 2/2 of dim 2``); None on one core.
        uncompared: the modules not compared, each with why (``name: why``).
    """

    first: Comparison | None
    kind: str | None
    last_inside: str | None
    compared: int
    problem: str | None = None
    held: str | None = None
    uncompared: tuple[str, ...] = ()

    def describe(self) -> str:
        """The search in words, for a FAIL's error and the assertion message."""
        if self.problem is not None:
            return f"no module named: {self.problem}"
        if self.first is None:
            return (
                f"every one of {self.compared} module outputs was inside the tolerance on the rerun: the fault is "
                "outside the modules (the code between them, such as a method the pipeline calls, or a decoding graph "
                "the rerun does not build)"
            )
        kind = f" ({self.kind})" if self.kind else ""
        inside = f"; the last module inside was {self.last_inside}" if self.last_inside else ""
        held = f" on {self.held}" if self.held else ""
        return (
            f"first diverging module {self.first.stage}{kind}{held}: relative distance from float32 "
            f"{self.first.distance:.4g}, {self.first.ratio:.3g}x the dtype's own noise {self.first.floor:.3g} "
            f"(at most {MULTIPLE:g}x){inside}"
        )


def first_diverging(scores: Sequence[Mapping[str, Any]], unpaired: Sequence[str] = ()) -> Divergence:
    """The first module out of tolerance among ``scores`` (each ``module``, ``kind``, ``distance`` and
    ``noise``, in execution order; a sharded run's also its worst ``rank`` and what it ``held``), and the last one
    inside before it. ``unpaired`` are the modules not compared, each ``name: why`` (recorded on one side only, a
    shape no slice of the CPU's matches): they are left out, and only when nothing is left is that the problem."""
    checked = calibrated(
        [{"stage": s["module"], "step": 0, "distance": s["distance"], "noise": s["noise"]} for s in scores]
    )
    uncompared = tuple(str(name) for name in unpaired)
    if not checked.comparisons:
        why = "no module output was compared"
        if uncompared:
            why += f" ({len(uncompared)} not compared, e.g. {'; '.join(uncompared[:3])})"
        return Divergence(None, None, None, 0, why, uncompared=uncompared)
    last_inside: str | None = None
    for score, comparison in zip(scores, checked.comparisons, strict=True):
        if not comparison.ok:
            held = f"rank {score['rank']}, {score['held']}" if score.get("rank") is not None else None
            compared = len(checked.comparisons)
            return Divergence(comparison, score.get("kind"), last_inside, compared, None, held, uncompared)
        last_inside = comparison.stage
    return Divergence(None, None, last_inside, len(checked.comparisons), uncompared=uncompared)


def row_fields(divergence: Divergence) -> dict[str, Any]:
    """The row's module-search columns (``data.records.Row``)."""
    first = divergence.first
    note = f"located: {divergence.compared} module outputs compared" if first is not None else divergence.describe()
    if first is not None and divergence.held:
        note += f" (out on {divergence.held})"
    if first is not None and divergence.uncompared:
        shown = "; ".join(divergence.uncompared[:3])
        note += f", {len(divergence.uncompared)} not compared (e.g. {shown})"
    return {
        "diverging_module": None if first is None else first.stage,
        "diverging_module_kind": divergence.kind,
        "diverging_distance": None if first is None else float(f"{first.distance:.6g}"),
        "diverging_ratio": None if first is None else float(f"{first.ratio:.6g}"),
        "last_inside_module": divergence.last_inside if first is not None else None,
        "locate_note": note,
    }
