"""The teacher-forced CPU check of a device run's tokens: one CPU forward over the prompt plus the
device's own tokens, scoring every position under the device's prefix (``verdict.tokens.teacher_forced``).

It runs wherever the host can hold the model (sharded runs included: one forward, not 32 slow decode
steps), is cached like the reference (for the commit the device run loaded), and is reused outright
when the free-running reference generated exactly the device's tokens after exactly the device's prefix
(its own pass already scored them there).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pytest_neuron_support.base.redaction import scrub
from pytest_neuron_support.planning.planner import DTYPE_BYTES, training_bytes
from pytest_neuron_support.run.caches import ReferenceCache, is_local, reference_key
from pytest_neuron_support.run.context import Job
from pytest_neuron_support.run.execution import failure_of
from pytest_neuron_support.run.runscript import RunSpec
from pytest_neuron_support.run.settings import Settings
from pytest_neuron_support.verdict.tokens import TeacherForced, teacher_forced

#: What a run.py result says of what precedes its generated tokens: the prompt's length, and an
#: encoder-decoder's decoder prompt (Whisper's start-of-transcript, language and task tokens; a
#: language the device detected differently is another prefix).
PREFIX_FIELDS = ("prompt_tokens", "prompt_ids", "decoder_prompt_ids")

#: Host memory a CPU-side run needs per byte of what it holds (weights, or a training state): the
#: activations, logits, the interpreter and the library around them.
CPU_CHECK_OVERHEAD = 1.25


@dataclass(frozen=True)
class ForcedCheck:
    """What the teacher-forced CPU check found, and how it got it.

    Attributes:
        forced: the summary (None when it could not run: the host cannot hold the model, or it failed).
        how: ``reused`` (the reference's own pass), ``cached``, ``ran``, or ``skipped: <why>``.
        wall_s: seconds its run took here (0 when reused or cached; None when skipped).
        failure: (result, error) of a check run that did not finish, else None.
    """

    forced: TeacherForced | None
    how: str
    wall_s: float | None
    failure: tuple[str, str] | None = None


def memory_shortfall(parameters: int | None, dtype: str, settings: Settings, *, training: bool = False) -> str | None:
    """Why the host cannot hold a CPU-side run of a model of ``parameters`` in ``dtype`` (its weights, or
    with ``training`` its whole training state: the planner's memory model), x :data:`CPU_CHECK_OVERHEAD`;
    None when it can, or the size is unknown."""
    if not parameters:
        return None
    held = training_bytes(parameters, dtype) if training else parameters * DTYPE_BYTES[dtype]
    needed = int(held * CPU_CHECK_OVERHEAD)
    if settings.cpu_check_memory is not None:
        available, what = settings.cpu_check_memory, "--cpu-check-memory-gib allows"
    else:
        import psutil

        available, what = int(psutil.virtual_memory().available), "the host has available"
    if needed <= available:
        return None
    gib = 1 << 30
    if training:
        return (
            f"the CPU side of the training check needs ~{needed / gib:.1f} GiB of host memory ({dtype} training "
            f"state x {CPU_CHECK_OVERHEAD}), {what} {available / gib:.1f} GiB: no CPU steps to compare with"
        )
    return (
        f"needs ~{needed / gib:.1f} GiB of host memory ({dtype} weights x {CPU_CHECK_OVERHEAD}), "
        f"{what} {available / gib:.1f} GiB"
    )


def scored_alike(reference: Mapping[str, Any], result: Mapping[str, Any]) -> bool:
    """Whether the free-running ``reference``'s own teacher-forced pass is the device ``result``'s check:
    it scored the same tokens after the same prefix (:data:`PREFIX_FIELDS`), with the same snapshot's
    weights. Equal tokens after another prefix are other scores: each position's logprob is conditioned
    on everything before it."""
    tokens = [int(t) for t in result.get("tokens") or ()]
    if "forced" not in reference or [int(t) for t in reference.get("tokens") or ()] != tokens:
        return False
    return all(reference.get(field) == result.get(field) for field in (*PREFIX_FIELDS, "commit"))


def forced_check(
    job: Job,
    spec: RunSpec,
    result: Mapping[str, Any],
    parameters: int | None,
    reference: Mapping[str, Any] | None,
) -> ForcedCheck:
    """The teacher-forced CPU check of the device ``result``'s tokens. ``spec`` is the check's run.py
    (the reference's spec scoring the device's tokens); ``reference`` the free-running reference's
    result when there is one (its pass is reused when it generated the same tokens after the same
    prefix)."""
    device_top = result.get("top_logprobs") or ()
    if reference is not None and scored_alike(reference, result):
        return ForcedCheck(teacher_forced(reference["forced"], device_top), "reused", 0.0)
    short = memory_shortfall(parameters, spec.dtype, job.settings)
    if short is not None:
        return ForcedCheck(None, f"skipped: {short}", None)
    settings = job.settings
    key = reference_key(spec, settings.stack)
    cache = ReferenceCache(settings.reference_cache) if settings.reference_cache is not None else None
    # Of the commit the device run loaded: another snapshot's scores are another model's.
    commit = result.get("commit")
    cached = cache.get(key, commit, local=is_local(spec.model)) if cache is not None else None
    if cached is not None:
        return ForcedCheck(teacher_forced(cached["forced"], device_top), "cached", 0.0)
    checked, wall_s, failure = run_cpu_check(job, spec, "teacher-forced CPU check run.py")
    if checked is None:
        return ForcedCheck(None, "ran", wall_s, failure)
    if cache is not None:
        cache.put(key, checked)
    return ForcedCheck(teacher_forced(checked["forced"], device_top), "ran", wall_s)


def run_cpu_check(job: Job, spec: RunSpec, what: str) -> tuple[Mapping[str, Any] | None, float, tuple[str, str] | None]:
    """Run a CPU check's run.py ``spec`` in ``job``'s ``cpu-check`` folder: (its result, its seconds, None), or
    (None, its seconds, (result, error)) when it did not finish, the error naming ``what`` and scrubbed of the
    job's secrets. The teacher-forced checks of tokens and of a pipeline's stages both run this way."""
    _, outcome = job.execute_on_cpu(spec, "cpu-check")
    wall_s = round(outcome.wall_s, 3)
    checked = outcome.result
    if checked is None or not checked.get("ok"):
        status, _, error = failure_of(outcome, what, offline=job.settings.hub_unreachable, checkpoint=job.model.id)
        return None, wall_s, (status, scrub(error, job.environ) or "")
    return checked, wall_s, None


def forced_spec(reference: RunSpec, tokens: tuple[int, ...], prefix: Sequence[int] | None = None) -> RunSpec:
    """The teacher-forced CPU check's run.py: the reference's spec (CPU, eager, the reference dtype, the
    same inputs) scoring ``tokens`` instead of generating; an encoder-decoder's after the device run's own
    decoder prompt (``prefix``)."""
    spec = replace(reference, forced_tokens=tokens, score_own_tokens=False)
    if prefix is None:
        return spec
    return replace(spec, task_options={**spec.task_options, "forced_prefix": [int(t) for t in prefix]})
