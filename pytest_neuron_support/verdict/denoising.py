"""Text-to-image evidence: the teacher-forced denoising check, and how close the final images are.

The diffusion counterpart of the teacher-forced token check: at every denoising step the device's
latent (the very input its denoiser got) is fed to the CPU denoiser once, and the two noise
predictions are compared: relative error ``|device - cpu| / |cpu|`` and cosine similarity, each over
the whole prediction (classifier-free guidance's two halves included). A step passes when its relative
error is at most :data:`MAX_REL_ERROR` and its cosine at least :data:`MIN_COSINE`; the first step out
of tolerance is named, with how far out. The final images are compared too (:func:`psnr`), as evidence.

Pure functions of plain data: the controller never imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: Per-step tolerance of the noise prediction, device vs CPU under the device's latent. Measured on the
#: tiny zoo's text-to-image pipeline (bf16, 4 DDIM steps, guidance 5): torch.compile (inductor) against
#: eager on CPU differed by a relative error of 0.66 % to 1.34 % per step (cosine 0.99991 to 0.99998).
#: 5 % is about 4x the largest; a wrong kernel or a corrupted step moves the prediction by far more.
MAX_REL_ERROR = 0.05
#: Per-step cosine of the two noise predictions: the same measurement's smallest was 0.99991.
MIN_COSINE = 0.999
#: PSNR recorded for two identical images (the formula's infinity, kept finite for Parquet and JSON).
IDENTICAL_PSNR_DB = 100.0


@dataclass(frozen=True)
class Denoising:
    """Every denoising step of a device run, scored under the device's own latents.

    Attributes:
        steps_checked: denoiser calls compared.
        rel_errors / cosines: each step's relative error and cosine, in order.
        first_bad_step: the first step (0-based) out of tolerance, else None.
        rel_error / cosine: that step's (None when every step is within tolerance).
        max_rel_error / min_cosine: the worst over every step (None when nothing was compared).
        problem: why nothing could be compared (the runs made a different number of calls), else None.
    """

    steps_checked: int
    rel_errors: tuple[float, ...]
    cosines: tuple[float, ...]
    first_bad_step: int | None
    rel_error: float | None
    cosine: float | None
    max_rel_error: float | None
    min_cosine: float | None
    problem: str | None = None

    @property
    def match(self) -> bool:
        return self.problem is None and self.steps_checked > 0 and self.first_bad_step is None


def denoising(positions: Sequence[Mapping[str, Any]], expected_steps: int) -> Denoising:
    """Summarise the teacher-forced check's per-step scores (``rel_error``, ``cosine``); ``expected_steps``
    is how many denoiser calls the device run made (every one must have been scored)."""
    rel = tuple(float(p["rel_error"]) for p in positions)
    cos = tuple(float(p["cosine"]) for p in positions)
    worst_rel = max(rel, default=None)
    worst_cos = min(cos, default=None)
    if len(positions) != expected_steps or not positions:
        problem = f"the CPU check scored {len(positions)} denoiser call(s) of the device run's {expected_steps}"
        return Denoising(len(positions), rel, cos, None, None, None, worst_rel, worst_cos, problem)
    for step, (error, cosine) in enumerate(zip(rel, cos, strict=True)):
        if not (math.isfinite(error) and error <= MAX_REL_ERROR and math.isfinite(cosine) and cosine >= MIN_COSINE):
            return Denoising(len(positions), rel, cos, step, error, cosine, worst_rel, worst_cos)
    return Denoising(len(positions), rel, cos, None, None, None, worst_rel, worst_cos)


def psnr(device: Sequence[int], reference: Sequence[int]) -> float | None:
    """Peak signal-to-noise ratio in dB of two 8-bit images given as flat pixel values (None when they
    cannot be compared: different sizes, nothing to compare); :data:`IDENTICAL_PSNR_DB` when identical."""
    if not device or len(device) != len(reference):
        return None
    squared = math.fsum((a - b) * (a - b) for a, b in zip(device, reference, strict=True))
    if squared == 0:
        return IDENTICAL_PSNR_DB
    mse = squared / len(device)
    return round(min(IDENTICAL_PSNR_DB, 10 * math.log10(255.0 * 255.0 / mse)), 3)
