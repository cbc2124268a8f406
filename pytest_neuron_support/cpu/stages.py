"""The teacher-forced pipeline check: a diffusers pipeline's recording from the device run (every
denoiser call's inputs and output, the guidance combine, each scheduler step, the VAE decode) replayed
through the same pipeline on CPU, eager, once in float32 and once in the device's dtype, every stage fed
the device's own inputs. Its run.py (the reference's, with ``forced_io`` set) writes each stage's
distances; :func:`stages_check` runs it and turns them into the calibrated tolerance rule's evidence
(``verdict.tolerance``). The decision is ``verdict.decide.numeric``'s.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from pytest_neuron_support.cpu.forced import memory_shortfall, run_cpu_check
from pytest_neuron_support.run.context import Job
from pytest_neuron_support.run.runscript import RunSpec
from pytest_neuron_support.verdict.tolerance import Calibrated, calibrated


@dataclass(frozen=True)
class StagesCheck:
    """What the teacher-forced pipeline check found, and how it got it.

    Attributes:
        evidence: every stage's comparison in execution order, with any problem of the check itself (a
            stage scored for fewer calls than the device made); None when it could not run.
        how: ``ran``, or ``skipped: <why>`` (the host cannot hold the pipeline in float32).
        wall_s: seconds its run took (None when skipped).
        failure: (result, error) of a check run that did not finish, else None.
    """

    evidence: Calibrated | None
    how: str
    wall_s: float | None
    failure: tuple[str, str] | None = None


def stages_spec(reference: RunSpec, recording: Path, noise_dtype: str) -> RunSpec:
    """The check's run.py: the free-running reference's spec (CPU, eager, the same call), in float32,
    replaying ``recording`` and measuring the CPU's own noise in ``noise_dtype`` (the device's dtype)."""
    options = {**dict(reference.task_options), "forced_io": str(recording), "noise_dtype": noise_dtype}
    return replace(reference, dtype="float32", task_options=options)


def stages_check(job: Job, spec: RunSpec, parameters: int | None) -> StagesCheck:
    """Run the teacher-forced pipeline check ``spec`` (:func:`stages_spec`) for ``job``'s device run, unless
    the host cannot hold a pipeline of ``parameters`` in float32 (then nothing else can vouch for the
    numbers: the caller's row says why it is not decided)."""
    short = memory_shortfall(parameters, "float32", job.settings)
    if short is not None:
        return StagesCheck(None, f"skipped: {short}", None)
    checked, wall_s, failure = run_cpu_check(job, spec, "teacher-forced pipeline check run.py")
    if checked is None:
        return StagesCheck(None, "ran", wall_s, failure)
    return StagesCheck(calibrated(checked.get("stages") or (), checked.get("calls")), "ran", wall_s)
