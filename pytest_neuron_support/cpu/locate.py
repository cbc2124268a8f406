"""The first diverging module of a numerics FAIL: one forward again on the device and on CPU, with a hook
on every module (``SPEC["locate"]`` in run.py), and the calibrated rule on each module's output
(``verdict.modules``).

It runs only after a numerics FAIL (a PASS costs nothing): one more run.py on the device, under a lease of
the same cores taken again (the device run's was released when it ended), that saves every module's output
of one forward at the first bad position; then one on CPU that runs the same forward in float32 and in the
device's dtype and scores the device's outputs. So it costs one extra forward on the device and two on the
CPU (float32, and the dtype's own noise the rule judges against), each in a fresh process that loads the
checkpoint again.

A sharded run is searched rank by rank: each rank saves what it holds of every module's output, and the CPU
side compares each with the CPU output's slice it matches (all of it for a replicated module or a row-parallel
one after its all-reduce, the rank's own chunk for a column-parallel one); a module whose parts match no slice is
left out, with why, and the row counts those (``locate_note``).
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pytest_neuron_support.base.redaction import scrub
from pytest_neuron_support.base.storage import write_atomic
from pytest_neuron_support.run.context import DEVICE_RUN, Job
from pytest_neuron_support.run.execution import failure_of
from pytest_neuron_support.run.runscript import RunSpec, render
from pytest_neuron_support.verdict.modules import Divergence, first_diverging
from pytest_neuron_support.verdict.tolerance import FLOOR, MULTIPLE

#: The run folders of the two runs, beside the check's own.
DEVICE_FOLDER = "locate-device"
CPU_FOLDER = "locate-cpu"
#: Where the first diverging module's standalone reproducer is written.
MODULE_FOLDER = "module-repro"


@dataclass(frozen=True)
class Located:
    """The module search's outcome.

    Attributes:
        divergence: what the scores say (None when the search did not run or a run failed).
        note: why it did not run, or how it went (with both runs' seconds).
    """

    divergence: Divergence | None
    note: str


def locate(job: Job, device: RunSpec, cpu: RunSpec, options: Mapping[str, Any]) -> Located:
    """Search the first diverging module of ``job``'s FAIL: ``device`` is the device run's own spec (its
    backend, dtype and post-load code), ``cpu`` the CPU reference's, ``options`` the task's locate inputs
    (``tokens``: the device's prefix up to the first bad token)."""
    recorded(job, options, DEVICE_FOLDER)
    outcome = job.rerun_on_device(replace(device, locate=dict(options)), DEVICE_FOLDER)
    if outcome is None:
        return Located(None, "not searched: no lease to run the device again on")
    traced = outcome.result
    if traced is None or not traced.get("ok"):
        return Located(None, f"not searched: the device rerun failed: {_failure(job, outcome, 'the device rerun')}")
    on_cpu = replace(
        cpu,
        dtype="float32",
        locate={**options, "device_traces": traced["traces"], "noise_dtype": device.dtype, "floor": FLOOR},
    )
    recorded(job, options, CPU_FOLDER)
    _, outcome = job.execute_on_cpu(on_cpu, CPU_FOLDER)
    scored = outcome.result
    if scored is None or not scored.get("ok"):
        return Located(None, f"not searched: the CPU rerun failed: {_failure(job, outcome, 'the CPU rerun')}")
    divergence = first_diverging(scored.get("modules") or (), scored.get("unpaired") or ())
    seconds = f"device rerun {outcome_s(traced)}, CPU rerun {outcome_s(scored)}"
    return Located(divergence, seconds)


def module_reproducer(job: Job, device: RunSpec, options: Mapping[str, Any], module: str) -> Path:
    """Write the first diverging module's standalone reproducer (``MODULE_FOLDER/run.py``): the device run's own
    run.py, whose SPEC["locate"] names the module, so that it feeds that module alone the inputs it records from
    the CPU model and prints the device's distance and ratio (run.py's ``reproduce_module``). Written, not run:
    running it is one more device run, which a FAIL does not pay for."""
    spec = replace(
        device,
        locate={**options, "module": module, "noise_dtype": device.dtype, "multiple": MULTIPLE, "floor": FLOOR},
    )
    recorded(job, options, MODULE_FOLDER)
    return write_atomic(job.workdir / MODULE_FOLDER / "run.py", render(spec))


def recorded(job: Job, options: Mapping[str, Any], folder: str) -> None:
    """The device run's recording the search's forward is fed from (``options["recording"]``, a text-to-image
    run's denoiser_io.pt), copied beside the run.py written in ``folder``: each of them stands alone."""
    name = options.get("recording")
    if name:
        source = job.workdir / DEVICE_RUN / str(name)

        def copy(tmp: Path) -> None:
            shutil.copyfile(source, tmp)

        write_atomic(job.workdir / folder / str(name), copy)


def outcome_s(result: Mapping[str, Any]) -> str:
    """A rerun's own forward-and-record seconds, in words."""
    seconds = result.get("locate_s")
    return "?" if seconds is None else f"{float(seconds):.2f} s"


def _failure(job: Job, outcome: Any, what: str) -> str:
    _, stage, error = failure_of(outcome, what, offline=job.settings.hub_unreachable, checkpoint=job.model.id)
    return f"at {stage}: {scrub(error, job.environ) or ''}"[:500]
