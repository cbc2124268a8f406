"""The fluency judge's rules: the cheap checks that need no judge model, and what judge.py asks.

A sharded run's text is read by a small instruct model on CPU (``--judge-model``); before it, the
checks here fail what cannot be fluent at all (nothing generated, one token repeated, special tokens
in place of text, bytes that do not print).
"""

from __future__ import annotations

from collections.abc import Sequence

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
