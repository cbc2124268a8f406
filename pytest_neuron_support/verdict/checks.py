"""Verdicts: does the device output match the CPU reference?

PASS (``exact`` parity, the seed's meaning) needs every generated token equal. Whatever the
verdict, the evidence is kept: matched prefix, first divergence, both tokens and their
logprob gap, so a reader can tell a near-tie from a broken model (``shared/reference/
verdicts.md``: a divergence at token 0 means broken, late drift means numerics).

Every generation run also gets a **teacher-forced** check (:func:`teacher_forced`): one CPU forward
over the prompt plus the device's own tokens scores each position under the device's prefix, so a
one-off near-tie is told from a broken model at every position, not only up to the first
divergence, and a sharded run's tokens are checked for what they are, not for how fluent they read.

Embedding tasks have no tokens: PASS needs every sentence's device embedding to point the same
way as its CPU embedding, cosine similarity at least :data:`DEFAULT_MIN_COSINE` (or the catalog
entry's ``min_cosine``); the row keeps the smallest cosine.
"""

from __future__ import annotations

import math
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


#: Default judge of sharded runs: a small instruct model that runs on any host CPU.
DEFAULT_JUDGE = "Qwen/Qwen2.5-0.5B-Instruct"
#: P(yes | yes or no) at or above which the judge's answer counts as "fluent".
JUDGE_THRESHOLD = 0.5
#: The yes/no question the judge answers; ``{text}`` is the generated text. Shared by judge.py
#: and by the tiny zoo's judge, which is trained on exactly this prompt.
JUDGE_QUESTION = (
    "Is the following text fluent, grammatical English (repetition is allowed)? "
    'Answer with yes or no.\n\nText: "{text}"'
)
#: Answer variants whose first tokens count as "yes" / "no".
YES_WORDS: tuple[str, ...] = ("yes", "Yes", " yes", " Yes", "YES")
NO_WORDS: tuple[str, ...] = ("no", "No", " no", " No", "NO")
#: Text whose printable share is below this is garbage, whatever a judge would say.
MIN_PRINTABLE = 0.9


def fluency_precheck(
    text: str, tokens: Sequence[int], special_ids: Sequence[int] = (), eos_id: int | None = None
) -> str | None:
    """Cheap failures that need no judge: why the text cannot be fluent, or None.

    Runs before the judge model so broken outputs fail fast: nothing generated, the same
    token over and over (a classic symptom of a broken sharded matmul), special tokens in place
    of text (a dead model emits the pad token; the judge reads text decoded without special
    tokens and would see only the words before them), or mostly bytes that do not print.
    """
    if not tokens or not text.strip():
        return "empty output"
    if len(tokens) > 1 and len(set(tokens)) == 1:
        return f"one token repeated {len(tokens)} times (id {tokens[0]})"
    special = set(special_ids)
    # One end-of-sequence token closing the text is how generation stops; any other special token is not text.
    body = list(tokens[:-1]) if eos_id is not None and tokens[-1] == eos_id else list(tokens)
    inside = [t for t in body if t in special]
    if inside:
        return f"{len(inside)} of {len(tokens)} generated tokens are special tokens (first: id {inside[0]})"
    return text_precheck(text)  # the text is not empty here: what is left is whether it prints


def text_precheck(text: str) -> str | None:
    """:func:`fluency_precheck`'s checks that need no tokens, for a text given to the judge as text
    (``neuron_judge("...")``): nothing to read, or mostly characters that do not print."""
    if not text.strip():
        return "empty output"
    printable = sum(1 for ch in text if ch.isprintable() or ch in "\n\t")
    if printable / len(text) < MIN_PRINTABLE:
        return f"mostly non-printable ({printable} of {len(text)} characters print)"
    return None


#: Cosine similarity every sentence's device embedding must reach against its CPU embedding.
#: 1 - 1e-3, as peers check sentence-transformers ports (optimum's exporters compare with an
#: absolute tolerance of 1e-3 or less): bf16 rounding of a healthy encoder stays far above it,
#: while a wrong kernel or a corrupted weight drops far below.
DEFAULT_MIN_COSINE = 1 - 1e-3

#: What embedding tasks embed: short and long, punctuation, digits, casing and non-ASCII, so the
#: batch is padded (the pooling mask matters) and the tokenizer's edge cases are exercised.
EMBEDDING_SENTENCES: tuple[str, ...] = (
    "The history of the printing press begins in the fifteenth century.",
    "A man is playing a guitar.",
    "Someone is playing an instrument on stage.",
    "The cat sits on the warm windowsill and watches the birds outside, ignoring the dog.",
    "Stock markets fell 3.2% on Tuesday after the announcement.",
    "How do I reset my password?",
    "Café au lait costs €4 in Paris; naïve tourists pay more.",
    "AWS Trainium runs PyTorch models through TorchNeuron.",
)


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


# --- The training check ------------------------------------------------------------------------

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
