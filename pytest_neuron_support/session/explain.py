"""What pytest prints when a verdict's ``assert`` fails: the row's evidence, like a list diff.

``assert check.result == "PASS"`` compares a :class:`Verdict` (a ``str`` that carries its row) with
a string; :func:`explain` is the plugin's ``pytest_assertrepr_compare`` for exactly that
comparison. It shows the result and stage, what decided it, and for a token mismatch the matched
prefix, the first divergence, both tokens (ids, and their text where the tokenizer is at hand) and
their gap, with the two sequences around it marked the way pytest marks a differing list item.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pytest_neuron_support.data.records import Row

#: Tokens shown on each side of the first divergence.
CONTEXT = 4


class Verdict(str):
    """A check's result (``PASS``, ``FAIL``, ``ERROR``, ...), a plain ``str`` that also carries the
    row it came from and where its run's files are, so a failed ``assert verdict == "PASS"`` can
    explain itself.

    Attributes:
        row: the check's row.
        directory: the folder of its run.py, result.json and log.txt.
    """

    row: Row
    directory: Path

    def __new__(cls, row: Row, directory: Path) -> Verdict:
        verdict = super().__new__(cls, row.result)
        verdict.row = row
        verdict.directory = directory
        return verdict


def explain(op: str, left: object, right: object) -> list[str] | None:
    """pytest_assertrepr_compare for ``Verdict == str``; None for every other comparison."""
    if op != "==" or not isinstance(left, Verdict) or isinstance(right, Verdict) or not isinstance(right, str):
        return None
    row = left.row
    where = f" at stage {row.failure_stage}" if row.failure_stage else ""
    # pytest shows 8 lines of an explanation unless -vv: the evidence first, the error text only
    # where no evidence line says it already.
    lines = [f"{str(left)!r} == {right!r}", f"{row.model_id}: {row.result}{where}, decided by {row.verdict_basis}"]
    evidence = _parity_lines(row) or _teacher_forced_lines(row) or _repeat_lines(row) or _training_lines(row)
    # Where inside the model it started comes right after what decided it: the line an engineer reads first.
    lines += _module_lines(row)
    if row.error and not evidence:
        lines.append(f"error: {row.error}")
    lines += evidence
    if row.judge_verdict and not evidence:
        score = f" (P(yes) {row.judge_score:.3f})" if row.judge_score is not None else ""
        lines.append(f"judge {row.judge_model}: {row.judge_verdict}{score}")
    script = "train.py (device/ and cpu/)" if row.check == "train" else "run.py"
    lines.append(f"{script}, result.json and log.txt: {left.directory}")
    return lines


def _module_lines(row: Row) -> list[str]:
    """The numerics FAIL's first diverging module (or why none was named)."""
    if row.diverging_module is not None:
        kind = f" ({row.diverging_module_kind})" if row.diverging_module_kind else ""
        inside = f"; last inside: {row.last_inside_module}" if row.last_inside_module else ""
        return [
            f"first diverging module: {row.diverging_module}{kind}, distance {row.diverging_distance:.4g} = "
            f"{row.diverging_ratio:.3g}x the dtype's noise{inside}"
        ]
    return [f"module search: {brief(row.locate_note)}"] if row.locate_note else []


#: The longest note the assertion message quotes whole: pytest cuts a message of more than 640 characters
#: (outside CI) before the evidence lines after it, and the row and `neuron-support explain` keep the note whole.
NOTE_CHARS = 120


def brief(note: str) -> str:
    """``note`` as the assertion message quotes it: whole up to :data:`NOTE_CHARS`, else cut at a word, with "…"."""
    if len(note) <= NOTE_CHARS:
        return note
    return note[: note.rfind(" ", 0, NOTE_CHARS)] + " …"


def _training_lines(row: Row) -> list[str]:
    """A training FAIL: the error (which step, what, both values), then both runs' per-step losses."""
    if row.check != "train" or row.result != "FAIL" or not row.error:
        return []
    return [
        f"error: {row.error}",
        f"- CPU losses    {[round(v, 4) for v in row.cpu_train_losses]}",
        f"+ device losses {[round(v, 4) for v in row.train_losses]}",
    ]


def _parity_lines(row: Row) -> list[str]:
    """The free-running comparison with the CPU reference (one-core runs)."""
    index = row.first_divergence
    if index is None or not row.reference_tokens:
        return []
    gap = f", gap {row.logprob_gap:.4f} nats" if row.logprob_gap is not None else ""
    tie = " (a near-tie)" if row.near_tie else ""
    return [
        f"matched prefix {row.matched_prefix} of {len(row.tokens)}; first divergence at index {index}: "
        f"device {_token(row.device_token)} != CPU {_token(row.reference_token)}{gap}{tie}",
        *_diff("device", row.tokens, "CPU", row.reference_tokens, index),
    ]


def _teacher_forced_lines(row: Row) -> list[str]:
    """The teacher-forced CPU pass over the device's own tokens (a forward task's disagreeing decisions use
    the same columns, with no tokens: its error says them)."""
    index = row.first_disagreement
    if index is None or not row.tokens:
        return []
    deficit = f", {row.disagreement_deficit:.4f} nats below" if row.disagreement_deficit is not None else ""
    cpu_view = list(row.tokens)
    if index < len(cpu_view) and row.disagreement_cpu_token is not None:
        cpu_view[index] = row.disagreement_cpu_token
    return [
        f"teacher-forced: {row.positions_disagreeing} of {row.positions_checked} device tokens are not the CPU "
        f"top-1; matched prefix {index}; first divergence at index {index}: device "
        f"{_token(row.disagreement_device_token)} (CPU rank {row.disagreement_rank}) != CPU top-1 "
        f"{_token(row.disagreement_cpu_token)}{deficit}",
        *_diff("device", row.tokens, "CPU top-1", cpu_view[: index + 1], index),
    ]


def _repeat_lines(row: Row) -> list[str]:
    if row.repeat_identical is not False or row.repeat_divergence is None:
        return []
    return [f"the warm second generate() parted from the first at index {row.repeat_divergence}"]


def _token(token: int | None) -> str:
    return "(none)" if token is None else str(token)


def _diff(left_name: str, left: Sequence[int], right_name: str, right: Sequence[int], index: int) -> list[str]:
    """Both sequences around ``index``, the differing item marked (``-`` CPU, ``+`` device)."""
    start = max(index - CONTEXT, 0)
    width = max(len(left_name), len(right_name))

    def window(tokens: Sequence[int]) -> str:
        shown = [str(t) for t in tokens[start : index + CONTEXT + 1]]
        head = "..., " if start > 0 else ""
        tail = ", ..." if index + CONTEXT + 1 < len(tokens) else ""
        return f"[{head}{', '.join(shown)}{tail}]"

    return [f"- {right_name:<{width}} {window(right)}", f"+ {left_name:<{width}} {window(left)}"]
