"""Embedding evidence: is every sentence's device embedding the CPU's, within the dtype's own noise?

Embedding tasks have no tokens. Each sentence's device embedding is judged by the calibrated tolerance
rule (``verdict.tolerance``): its relative distance from the CPU's float32 embedding against the distance
of the CPU's own embedding in the device's dtype (:func:`calibrated_embeddings`). It must also point the
same way as the CPU's, cosine similarity at least the catalog entry's ``min_cosine`` (default
:data:`DEFAULT_MIN_COSINE`): the stated correlation a model is held to, as peers state one per model; the
row keeps the smallest cosine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_neuron_support.verdict.tolerance import Calibrated, calibrated_outputs

#: Cosine similarity every sentence's device embedding must reach against its CPU embedding.
#: 1 - 1e-3, as peers check sentence-transformers ports (optimum's exporters compare with an
#: absolute tolerance of 1e-3 or less): bf16 rounding of a healthy encoder stays far above it,
#: while a wrong kernel or a corrupted weight drops far below.
DEFAULT_MIN_COSINE = 1 - 1e-3


@dataclass(frozen=True)
class EmbeddingParity:
    """Sentence-by-sentence comparison of device embeddings with their CPU reference.

    Attributes:
        match: same count and width, and every cosine at least the threshold.
        min_cosine: the smallest cosine (NaN if an embedding holds NaN/inf); None when the
            embeddings cannot be compared at all (count or width differ, nothing embedded).
        worst_index: the sentence with the smallest cosine, None when not comparable.
        cosines: every sentence's cosine, in order.
        threshold: the cosine each sentence had to reach.
        problem: why the embeddings could not be compared, else None.
    """

    match: bool
    min_cosine: float | None
    worst_index: int | None
    cosines: tuple[float, ...]
    threshold: float
    problem: str | None = None


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine similarity of two vectors (pure Python: the controller never imports torch).

    NaN when either holds a non-finite value; 0.0 when either is all zeros (no direction).
    """
    if not all(math.isfinite(x) for x in a) or not all(math.isfinite(y) for y in b):
        return math.nan
    dot = math.fsum(x * y for x, y in zip(a, b, strict=True))
    norms = math.sqrt(math.fsum(x * x for x in a)) * math.sqrt(math.fsum(y * y for y in b))
    if norms == 0.0:
        return 0.0
    return max(-1.0, min(1.0, dot / norms))


def compare_embeddings(
    device: Sequence[Sequence[float]], reference: Sequence[Sequence[float]], threshold: float = DEFAULT_MIN_COSINE
) -> EmbeddingParity:
    """Compare embeddings sentence by sentence; see :class:`EmbeddingParity`."""
    if not device or len(device) != len(reference):
        problem = f"{len(device)} device embeddings for {len(reference)} reference embeddings"
        return EmbeddingParity(False, None, None, (), threshold, problem)
    widths = {len(v) for v in device} | {len(v) for v in reference}
    if len(widths) != 1:
        problem = f"embedding widths differ: {sorted(widths)}"
        return EmbeddingParity(False, None, None, (), threshold, problem)
    cosines = tuple(cosine(a, b) for a, b in zip(device, reference, strict=True))
    if any(math.isnan(c) for c in cosines):
        worst = next(i for i, c in enumerate(cosines) if math.isnan(c))
        return EmbeddingParity(False, math.nan, worst, cosines, threshold)
    worst = min(range(len(cosines)), key=cosines.__getitem__)
    return EmbeddingParity(cosines[worst] >= threshold, cosines[worst], worst, cosines, threshold)


def calibrated_embeddings(
    device: Sequence[Sequence[float]], float32: Sequence[Sequence[float]], in_dtype: Sequence[Sequence[float]]
) -> Calibrated:
    """Each sentence's device embedding against the CPU's float32 one, next to the CPU's own in the device's
    dtype (stage ``embedding``, step = the sentence)."""
    return calibrated_outputs("embedding", device, float32, in_dtype)
