"""A compile ERROR's standalone reproducer: the device run once more with Dynamo's own repro settings on.

``torch._dynamo.config.repro_after = "dynamo"`` (level 1) wraps the backend: when it fails on a graph,
Dynamo writes that graph as ``repro.py`` in the run's folder (its inputs under ``checkpoints/``), a script
that compiles the graph with the same backend and fails the same way, with no model, no transformers and no
harness. ``python3 repro.py run --no-save-dir`` runs it on random inputs of the same shapes: without the
model's weights. Only a compile ERROR that is the backend's (``BackendCompilerFailed``) pays for it (one more
device run, under a lease of the same cores taken again); a sharded run is not rerun (every rank would write its
repro.py into the one folder).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from pytest_neuron_support.run.context import Job
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


#: How Dynamo reports an exception its backend raised while compiling a graph (``BackendCompilerFailed``): the
#: only compile ERROR its repro machinery captures. Another one (Dynamo's own tracing, a check that compiled
#: nothing, a pipeline's post-processing reported at compile) is not rerun: there is no graph to write.
BACKEND_FAILED = "BackendCompilerFailed"


def capture_compile_failure(job: Job, spec: RunSpec, error: str) -> Reproducer:
    """Run ``spec`` (the device run that failed at compile with ``error``) again with Dynamo's repro settings, in
    :data:`FOLDER`; the script Dynamo wrote, if the rerun failed the same way."""
    if not error.startswith(BACKEND_FAILED):
        kind = error.split(":", 1)[0] or "an error"
        return Reproducer(
            None, f"not captured: {kind} is not the backend failing on a graph ({BACKEND_FAILED}), not rerun"
        )
    if job.sharded:
        return Reproducer(None, f"not captured: a sharded run ({job.plan.cores} ranks would each write repro.py)")
    outcome = job.rerun_on_device(replace(spec, capture_compile_failure=True), FOLDER)
    if outcome is None:
        return Reproducer(None, "not captured: no lease to run the device again on")
    script = job.workdir / FOLDER / SCRIPT
    result = outcome.result or {}
    # Written for this very failure only: a rerun that failed another way (or passed) leaves no reproducer of it.
    if script.is_file() and result.get("error_type") == BACKEND_FAILED:
        return Reproducer(
            script,
            f"captured by Dynamo's repro_after='dynamo' on a rerun ({outcome.wall_s:.1f} s): "
            f"python3 {SCRIPT} fails as the run did; python3 {SCRIPT} run --no-save-dir does on random inputs",
        )
    stage = result.get("stage") or outcome.last_stage
    ended = "passed" if result.get("ok") else f"failed at {stage} with {result.get('error_type') or 'no result'}"
    return Reproducer(None, f"not captured: the rerun {ended}, and Dynamo wrote no {SCRIPT} of this failure")
