"""A compile ERROR's standalone reproducer: the device run once more with Dynamo's own repro settings on.

``torch._dynamo.config.repro_after = "dynamo"`` (level 1) wraps the backend: when it fails on a graph,
Dynamo writes that graph as ``repro.py`` in the run's folder (its inputs under ``checkpoints/``), a script
that compiles the graph with the same backend and fails the same way, with no model, no transformers and no
harness. ``python3 repro.py run --no-save-dir`` runs it on random inputs of the same shapes: without the
model's weights. Only a compile ERROR pays for it (one more device run, under a lease of the same cores taken
again); a sharded run is not rerun (every rank would write its repro.py into the one folder).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

from pytest_neuron_support.run.context import Job, device_run_env
from pytest_neuron_support.run.runscript import RunSpec

#: The rerun's folder, beside the check's own run folders.
FOLDER = "compile-repro"
#: What Dynamo names the script (``torch._dynamo.repro.after_dynamo.dump_backend_repro_as_file``).
SCRIPT = "repro.py"


@dataclass(frozen=True)
class Reproducer:
    """What the rerun left.

    Attributes:
        script: the reproducer's path, None when none was written.
        note: how it was made, or why there is none.
    """

    script: Path | None
    note: str


def capture_compile_failure(job: Job, spec: RunSpec) -> Reproducer:
    """Run ``spec`` (the device run that failed at compile) again with Dynamo's repro settings, in
    :data:`FOLDER`; the script Dynamo wrote, if any."""
    if job.sharded:
        return Reproducer(None, f"not captured: a sharded run ({job.plan.cores} ranks would each write repro.py)")
    if job.relet is None:
        return Reproducer(None, "not captured: no lease to run the device again on")
    settings = job.settings
    with job.relet() as (first, count):
        _, outcome = job.execute(
            replace(spec, capture_compile_failure=True),
            FOLDER,
            device_run_env(settings, job.environ, settings.device.pin_cores(first, count)),
        )
    script = job.workdir / FOLDER / SCRIPT
    if script.is_file():
        return Reproducer(
            script,
            f"captured by Dynamo's repro_after='dynamo' on a rerun ({outcome.wall_s:.1f} s): "
            f"python3 {SCRIPT} fails as the run did; python3 {SCRIPT} run --no-save-dir does on random inputs",
        )
    result = outcome.result or {}
    stage = result.get("stage") or outcome.last_stage
    ended = "passed" if result.get("ok") else f"failed at {stage}"
    return Reproducer(
        None,
        f"not captured: the rerun {ended} and Dynamo wrote no {SCRIPT} (the failure is not the backend's, "
        "compiling a graph Dynamo captured)",
    )


def relative_to(path: Path, root: Path) -> str:
    """``path`` relative to ``root`` where it lies there (a row's paths are read from its results folder), else
    absolute."""
    try:
        return (
            os.path.relpath(path.resolve(), root.resolve())
            if path.resolve().is_relative_to(root.resolve())
            else str(path)
        )
    except OSError:
        return str(path)
