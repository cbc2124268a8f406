"""Training evidence: do the device's per-step losses and gradient norms follow the CPU's?

The training check's fixed inputs (its texts, steps, batch, length, learning rate and seed) are here
beside its tolerances: both define what its evidence means, and the dataset card states both.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

#: The fixed text set train.py fine-tunes on (cycled to steps x batch examples), the same on the
#: device and on CPU. Plain English the zoo's tokenizers cover; padded to max_length, so every step
#: has the same shape.
TRAIN_TEXTS: tuple[str, ...] = (
    "the quick brown fox jumps over a lazy dog.",
    "a lazy dog sleeps in the warm evening sun.",
    "the clever bird sings a gentle song at night.",
    "that tall tree stands beside the quiet river.",
)
TRAIN_STEPS = 3
TRAIN_BATCH = 2
TRAIN_MAX_LENGTH = 32
TRAIN_LEARNING_RATE = 1e-3
TRAIN_SEED = 0
#: Per-step loss tolerance, device vs CPU: |device - cpu| <= LOSS_ATOL + LOSS_RTOL * |cpu|. Measured
#: on the tiny zoo (bf16, 3 steps of batch 2 at length 32): torch.compile with inductor against eager
#: on CPU differs by 3e-4, 3e-3 and 8e-3 nats for smollm3 and 3e-3, 4e-3 and 6e-3 for qwen3 (relative
#: at most 1.2e-3; the gap grows as bf16 updates compound). 2 % is ~16x the largest, for other
#: architectures and another compiler's fusions; a broken step moves the loss by far more.
LOSS_RTOL = 0.02
LOSS_ATOL = 0.01
#: Per-step gradient-norm tolerance (relative): the norm is summed in bf16, whose spacing is 2^-8
#: (0.4 %); the same measurement differed by 1.1 % (smollm3) and 0.5 % (qwen3) at most. 5 % is about
#: a dozen bf16 steps.
GRAD_NORM_RTOL = 0.05


@dataclass(frozen=True)
class TrainParity:
    """Per-step comparison of a device training run with the same steps on CPU.

    Attributes:
        match: every device loss is finite, the step counts agree, and every step's loss (and gradient
            norm where both recorded one) is within tolerance of the CPU's.
        steps_compared: steps both runs recorded.
        first_bad_step: the first step (1-based, as Trainer counts) that failed, else None.
        what: what failed there: ``loss not finite``, ``loss``, ``grad norm`` or ``step count``; None
            when all agree.
        device_value / cpu_value: the two values compared at that step (None where absent).
        max_loss_delta: the largest |device - cpu| loss difference over the compared steps.
    """

    match: bool
    steps_compared: int
    first_bad_step: int | None
    what: str | None
    device_value: float | None
    cpu_value: float | None
    max_loss_delta: float | None


def within(device: float, cpu: float, rtol: float, atol: float = 0.0) -> bool:
    """|device - cpu| <= atol + rtol * |cpu|, false for any non-finite value."""
    if not (math.isfinite(device) and math.isfinite(cpu)):
        return False
    return abs(device - cpu) <= atol + rtol * abs(cpu)


def compare_training(
    device_losses: Sequence[float],
    cpu_losses: Sequence[float],
    device_norms: Sequence[float | None] = (),
    cpu_norms: Sequence[float | None] = (),
) -> TrainParity:
    """Compare two training runs step by step: at each step the loss must be finite and within
    (LOSS_ATOL, LOSS_RTOL) of the CPU's, and the gradient norm within GRAD_NORM_RTOL (the norm shows a
    corrupted gradient at the step it hits; the loss only from the next step on)."""
    compared = min(len(device_losses), len(cpu_losses))
    deltas = [
        abs(d - c) for d, c in zip(device_losses, cpu_losses, strict=False) if math.isfinite(d) and math.isfinite(c)
    ]
    worst = round(max(deltas), 6) if deltas else None
    for index in range(compared):
        step, device, cpu = index + 1, float(device_losses[index]), float(cpu_losses[index])
        if not math.isfinite(device):
            return TrainParity(False, compared, step, "loss not finite", device, cpu, worst)
        # In a step's order: its forward (the loss), then its backward (the gradient norm).
        if not within(device, cpu, LOSS_RTOL, LOSS_ATOL):
            return TrainParity(False, compared, step, "loss", device, cpu, worst)
        norm = device_norms[index] if index < len(device_norms) else None
        cpu_norm = cpu_norms[index] if index < len(cpu_norms) else None
        if norm is not None and cpu_norm is not None and not within(float(norm), float(cpu_norm), GRAD_NORM_RTOL):
            return TrainParity(False, compared, step, "grad norm", float(norm), float(cpu_norm), worst)
    if compared == 0 or len(device_losses) != len(cpu_losses):
        return TrainParity(False, compared, compared + 1, "step count", None, None, worst)
    return TrainParity(True, compared, None, None, None, None, worst)
