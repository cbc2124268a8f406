"""A row's outcome against its catalog entry's expectation (``expect:``): pure functions, as the rest of
the verdict is.

An expectation is met when the row has the expected result (and, where the expectation names them, its
stage and the start of its failure signature); an expected ``PASS`` is one with Dynamo's recompile limit
hit (a known compile defect). A row that passes where a failure was expected, or no longer recompiles,
is an *improvement*: the suite fails it (a strict XPASS), so a fix that unblocks a model is seen and its
expectation dropped (``neuron-support expect update``). Any other outcome *differs*: a failure of its own.
SKIPPED and EXCLUDED rows ran nothing and are not compared.
"""

from __future__ import annotations

from pytest_neuron_support.base.model import Expectation

#: The row's outcome is the expected one (an XFAIL, or a PASS with its known compile defect).
MET = "met"
#: It passed where a failure was expected, or no longer recompiles: a strict XPASS, a failed item.
IMPROVED = "improved"
#: It failed otherwise than expected: a failure of its own.
DIFFERS = "differs"
#: Every value of a row's ``expectation`` column.
OUTCOMES: tuple[str, ...] = (MET, IMPROVED, DIFFERS)


def compare(expect: Expectation, result: str, stage: str | None, signature: str | None, recompiled: bool) -> str | None:
    """``met``, ``improved`` or ``differs`` for a row's result, stage, signature and whether it hit the
    recompile limit; None for a row that ran nothing (SKIPPED, EXCLUDED)."""
    if result in ("SKIPPED", "EXCLUDED"):
        return None
    if expect.result == "PASS":
        if result != "PASS":
            return DIFFERS
        return MET if recompiled or not expect.recompiles else IMPROVED
    if result == "PASS":
        return IMPROVED
    if result != expect.result or (expect.stage is not None and stage != expect.stage):
        return DIFFERS
    if expect.signature is not None and not (signature or "").startswith(expect.signature):
        return DIFFERS
    return MET


def describe(expect: Expectation) -> str:
    """The expectation in words: ``FAIL at parity, signature 'parity: teacher-forced …'``."""
    if expect.result == "PASS":
        return "PASS with Dynamo's recompile limit hit" if expect.recompiles else "PASS"
    text = expect.result + (f" at {expect.stage}" if expect.stage else "")
    return text + (f", signature {expect.signature!r}…" if expect.signature else "")


def message(expect: Expectation, outcome: str, result: str, stage: str | None, signature: str | None) -> str:
    """What the item says about its expectation (its XFAIL reason, or why it failed)."""
    if outcome == MET:
        return f"expected {describe(expect)}: {expect.reason}"
    if outcome == IMPROVED:
        got = "PASS" if result != "PASS" or not expect.recompiles else "PASS without hitting the recompile limit"
        return (
            f"unexpected improvement: expected {describe(expect)} ({expect.reason}), got {got}; if the fix has "
            "landed, drop the expectation (neuron-support expect update RESULTS writes the catalog)"
        )
    got = result + (f" at {stage}" if stage else "") + (f" ({signature})" if signature else "")
    return f"expected {describe(expect)} ({expect.reason}), got {got}"
