"""The fluency judge: cheap checks, then a small instruct model on CPU in its own process (judge.py).

Every sharded generation run's text is read by it and its verdict kept; it decides only where the host
cannot hold the model for the teacher-forced check (``verdict.decide.sharded``). ``neuron_judge`` gives
a user's test the same judge.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_neuron_support.base.redaction import scrub
from pytest_neuron_support.run.context import cpu_env
from pytest_neuron_support.run.execution import failure_of, run_script
from pytest_neuron_support.run.runscript import JudgeSpec, render_judge
from pytest_neuron_support.run.settings import Settings
from pytest_neuron_support.verdict.decide import Decision, judge_failed
from pytest_neuron_support.verdict.fluency import fluency_precheck, text_precheck


@dataclass(frozen=True)
class Judged:
    """What the judge said of one text.

    Attributes:
        judge_model / judge_revision: the judge (its resolved revision once it ran).
        verdict: ``fluent``, ``not fluent``, ``precheck: <why>`` or ``judge failed: <why>``.
        score: its P(yes | yes or no), None when a cheap check decided or it failed.
        failure: the decision when the text is not fluent (FAIL) or the judge could not run; None when
            it found the text fluent.
    """

    judge_model: str
    judge_revision: str
    verdict: str
    score: float | None
    failure: Decision | None

    def fields(self) -> dict[str, Any]:
        """The row's judge columns."""
        return {
            "judge_model": self.judge_model,
            "judge_revision": self.judge_revision,
            "judge_verdict": self.verdict,
            "judge_score": self.score,
        }


def judge(
    settings: Settings,
    workdir: Path,
    environ: Mapping[str, str],
    text: str,
    tokens: Sequence[int] = (),
    result: Mapping[str, Any] | None = None,
    *,
    text_only: bool = False,
) -> Judged:
    """Judge ``text`` (a run's, with its ``tokens`` and its ``result``'s special ids; or, ``text_only``, a
    text as it is: only the checks that read text apply, the token checks would call it empty)."""
    model, revision = settings.judge_model, settings.judge_revision
    result = result or {}
    if text_only:
        precheck = text_precheck(text)
    else:
        precheck = fluency_precheck(text, tokens, result.get("special_ids") or (), result.get("eos_id"))
    if precheck is not None:
        return Judged(model, revision, f"precheck: {precheck}", None, judge_failed("FAIL", precheck))
    directory = workdir / "judge"
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "judge.py"
    script.write_text(render_judge(JudgeSpec(model, revision, text)), encoding="utf-8")
    outcome = run_script(
        script,
        directory / "verdict.json",
        env=cpu_env(settings, environ),
        timeout=settings.model_timeout,
        log_path=directory / "log.txt",
        warm=True,  # judge.py compiles nothing: it may start from the session's warm interpreter
    )
    verdict = outcome.result
    if verdict is None or not verdict.get("ok"):
        status, _, error = failure_of(outcome, f"judge {model}", offline=settings.hub_unreachable, checkpoint=model)
        error = scrub(error, environ) or ""
        return Judged(model, revision, f"judge failed: {error[:300]}", None, judge_failed(status, error))
    score = float(verdict["score"])
    resolved = str(verdict.get("resolved_revision") or revision)
    if verdict["fluent"]:
        return Judged(model, resolved, "fluent", round(score, 6), None)
    error = f"judge {model} found the text not fluent (P(yes)={score:.3f}): {text[:200]!r}"
    return Judged(model, resolved, "not fluent", round(score, 6), judge_failed("FAIL", error))
