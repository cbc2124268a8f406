"""The calibrated tolerance rule: a device's numbers judged against the dtype's own noise.

One rule for every numeric check (a text-to-image pipeline's denoise, guidance, scheduler and decode
stages, sentence embeddings). Each comparison has three outputs of the same computation on the same
inputs (the device's own, recorded): the device's, the CPU's in float32 and the CPU's in the device's dtype.

- ``distance``: the device's relative L2 distance from float32, ``|device - cpu32| / |cpu32|``;
- ``noise``: the CPU's own dtype noise, ``|cpu_dtype - cpu32| / |cpu32|``: how far rounding to the
  device's dtype alone moves this output on this input;
- ``floor = max(noise, FLOOR)``, ``ratio = distance / floor``; the comparison passes when
  ``ratio <= MULTIPLE``.

This is PyTorch's accuracy gate (``rmse(fp64, compiled) <= k * rmse(fp64, eager) + tol``, k = 2 to 3
for bf16) and vLLM's three-way Neuron check (CPU float32, CPU bf16, device) in one formula: a stage whose
rounding is large (a deep denoiser in bf16) is given room in proportion, one whose rounding is tiny (a
scheduler step, a float32 run) is held tight, and no constant is measured once on a toy and applied to
every model. docs/verdicts.md records what the two numbers were measured on and the margin.

Pure functions of plain data: the controller never imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: How many times the CPU's own dtype noise a device output may be from float32. Measured (docs/verdicts.md,
#: "The calibrated tolerance rule"): a healthy run of the tiny zoo's pipeline compiled with inductor in bf16
#: reached a ratio of at most 1.0 over every stage and step, and trn2's published bf16 matmul error (P99
#: relative error 0.4 to 0.5 %) is the size of bf16's own rounding, a ratio near 1; 3 is PyTorch's own
#: multiple for bf16. Planted faults land at ratios of 68 to 327 (docs/verdicts.md).
MULTIPLE = 3.0
#: The least noise a comparison is judged against, as a relative L2 distance. Where the device's dtype is
#: float32 the CPU's dtype noise is zero by construction and a compiled float32 run still reorders sums
#: (measured on MiniLM in float32, inductor against eager: docs/verdicts.md); 1e-3 (a quarter of bf16's unit
#: roundoff, 2**-8) leaves that room and still fails a fault of more than 0.3 % in float32.
FLOOR = 1e-3


@dataclass(frozen=True)
class Comparison:
    """One output of one stage at one step, judged.

    Attributes:
        stage: what was compared (``denoise``, ``guidance``, ``scheduler``, ``decode``, ``embedding``).
        step: which call of that stage (0-based; a sentence for embeddings).
        distance: the device's relative L2 distance from the CPU in float32.
        noise: the CPU-in-the-device's-dtype's relative L2 distance from the CPU in float32.
    """

    stage: str
    step: int
    distance: float
    noise: float

    @property
    def floor(self) -> float:
        """The noise the distance is judged against: the dtype's own, at least :data:`FLOOR` (NaN when the
        CPU's own run in the device's dtype gave no finite output: there is nothing to judge against)."""
        return max(self.noise, FLOOR) if math.isfinite(self.noise) else math.nan

    @property
    def ratio(self) -> float:
        """distance / floor; inf when either is not finite (a NaN or overflowed output on either side never
        passes: an fp16 VAE that overflows on the CPU must not let any device output through)."""
        if not (math.isfinite(self.distance) and math.isfinite(self.floor)):
            return math.inf
        return self.distance / self.floor

    @property
    def ok(self) -> bool:
        return self.ratio <= MULTIPLE

    @property
    def label(self) -> str:
        return f"{self.stage}[{self.step}]"

    def describe(self) -> str:
        """The comparison in words, for a FAIL's error and a terminal line."""
        return (
            f"{self.stage} at step {self.step}: relative distance from float32 {self.distance:.4g} is "
            f"{self.ratio:.3g}x the dtype's own noise {self.floor:.3g} (at most {MULTIPLE:g}x)"
        )


@dataclass(frozen=True)
class Calibrated:
    """Every comparison of one numeric check, in order, and what could not be compared.

    Attributes:
        comparisons: every stage's comparisons, in the order the check ran them.
        problem: why the check is incomplete (a stage scored fewer calls than the device made), else None.
    """

    comparisons: tuple[Comparison, ...]
    problem: str | None = None

    @property
    def first_bad(self) -> Comparison | None:
        """The first comparison out of tolerance, in order (stages in the order a step runs them)."""
        return next((c for c in self.comparisons if not c.ok), None)

    @property
    def closest(self) -> Comparison | None:
        """The comparison nearest its tolerance (the largest ratio): how close a PASS was."""
        return max(self.comparisons, key=lambda c: c.ratio, default=None)

    @property
    def match(self) -> bool:
        return self.problem is None and bool(self.comparisons) and self.first_bad is None

    @property
    def decisive(self) -> Comparison | None:
        """The comparison a row reports: the first bad one on a FAIL, else the closest."""
        return self.first_bad or self.closest

    def stages(self) -> tuple[str, ...]:
        """The stages compared, each once, in order."""
        return tuple(dict.fromkeys(c.stage for c in self.comparisons))


def calibrated(scores: Sequence[Mapping[str, Any]], expected: Mapping[str, int] | None = None) -> Calibrated:
    """The comparisons of a check's per-call scores (``stage``, ``step``, ``distance``, ``noise``, in
    order). ``expected``, when given, is how many calls of each stage the device made: a stage scored for
    fewer (or more) is the check's problem, never a silent pass."""
    comparisons = tuple(
        Comparison(str(s["stage"]), int(s["step"]), _number(s["distance"]), _number(s["noise"])) for s in scores
    )
    problem = None
    if expected is not None:
        counted: dict[str, int] = {}
        for c in comparisons:
            counted[c.stage] = counted.get(c.stage, 0) + 1
        short = [
            f"{stage} {counted.get(stage, 0)} of {n}" for stage, n in expected.items() if counted.get(stage, 0) != n
        ]
        if short:
            problem = "the CPU check scored a different number of calls than the device run made: " + ", ".join(short)
    if not comparisons and problem is None:
        problem = "nothing was compared"
    return Calibrated(comparisons, problem)


def relative_distance(output: Sequence[float], reference: Sequence[float]) -> float:
    """|output - reference| / |reference| (pure Python; inf when the reference is zero and they differ,
    NaN when either holds a non-finite value)."""
    if not all(math.isfinite(x) for x in output) or not all(math.isfinite(y) for y in reference):
        return math.nan
    difference = math.sqrt(math.fsum((x - y) * (x - y) for x, y in zip(output, reference, strict=True)))
    scale = math.sqrt(math.fsum(y * y for y in reference))
    if scale == 0.0:
        return math.inf if difference > 0 else 0.0
    return difference / scale


def calibrated_outputs(
    stage: str,
    device: Sequence[Sequence[float]],
    float32: Sequence[Sequence[float]],
    in_dtype: Sequence[Sequence[float]],
) -> Calibrated:
    """Each item's device output vector against the CPU's float32 one, next to the CPU's own in the device's
    dtype (``stage`` names the output, step = the item: a sentence, a token, a mask)."""
    n = len(float32)
    if len(device) != n or len(in_dtype) != n or not n:
        return Calibrated(
            (), f"{len(device)} device, {n} float32 and {len(in_dtype)} CPU-dtype {stage} outputs: nothing to pair"
        )
    widths = {len(v) for v in (*device, *float32, *in_dtype)}
    if len(widths) != 1:
        return Calibrated((), f"{stage} widths differ: {sorted(widths)}")
    scores = [
        {"stage": stage, "step": i, "distance": relative_distance(d, f), "noise": relative_distance(r, f)}
        for i, (d, f, r) in enumerate(zip(device, float32, in_dtype, strict=True))
    ]
    return calibrated(scores)


def _number(value: Any) -> float:
    """A score as a float (a missing or non-numeric one is NaN: it fails, it never passes)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def row_fields(checked: Calibrated) -> dict[str, Any]:
    """The row's generic numeric-evidence columns (``data.records.Row``) for a check."""
    decisive = checked.decisive
    return {
        "numeric_stages": tuple(c.label for c in checked.comparisons),
        "numeric_ratios": tuple(_rounded(c.ratio) for c in checked.comparisons),
        "evidence_stage": None if decisive is None else decisive.stage,
        "evidence_step": None if decisive is None else decisive.step,
        "evidence_distance": None if decisive is None else _rounded(decisive.distance),
        "noise_floor": None if decisive is None else _rounded(decisive.floor),
        "noise_ratio": None if decisive is None else _rounded(decisive.ratio),
        "reference_match": checked.match,
    }


def _rounded(value: float) -> float:
    """Six significant figures (a row is read by people; inf and NaN stay as they are)."""
    return float(f"{value:.6g}") if math.isfinite(value) else value
