"""Text-to-image evidence beside the verdict: how close the device's final image is to a free-running
CPU run's from the same seed (PSNR). The verdict itself is the teacher-forced pipeline check under the
calibrated tolerance rule (``verdict.tolerance``): a free-running image drifts with every rounding
difference the denoising loop amplifies, so its PSNR is shown to a reader, never judged.

Pure functions of plain data: the controller never imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

#: PSNR recorded for two identical images (the formula's infinity, kept finite for Parquet and JSON).
IDENTICAL_PSNR_DB = 100.0


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
