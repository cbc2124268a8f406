"""The operations a device ran on the host instead (its fallback list), with their arguments' dtypes and shapes,
and a standalone reproducer that makes each of those calls again alone.

The device's list names ops only (torch-neuronx's ``get_fallback_ops()``). When a run's list is not empty, the
harness reruns it once more on the device (:data:`FOLDER`), eagerly (a dispatch mode sees eager ops only, and
torch.compile steps aside while one is active), with a dispatch mode that records every distinct call of those ops:
its op and overload, each argument's dtype and shape, how many times it was made (run.py's
``fallback_recorder``). The calls go into the row (``fallback_calls``), and :data:`REPRO_FOLDER` gets the
device run's run.py with ``SPEC["replay_fallbacks"]`` set: no model, no weights, each call made again alone on the
device with random tensors of those shapes, saying after each whether the device's list now names its op.

Only calls with a tensor on the device are kept (generate()'s own host work is no fallback), a sharded run's as
its rank 0 runs them (a DTensor's local part). The rerun's calls of an op include ones the device ran itself (an
op that falls back at one shape may not at another, and the compiled graphs run eagerly here); the reproducer
tells them apart, each call in a process of its own, since the device's list only grows. A device that keeps no
list (cpu, cuda) never pays for it; on neuron only a run with a fallback does, one more eager run under a lease of
the same cores.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from pytest_neuron_support.base.redaction import scrub
from pytest_neuron_support.base.storage import write_atomic
from pytest_neuron_support.run.context import Job
from pytest_neuron_support.run.runscript import RunSpec, render

#: The eager rerun's folder, beside the check's own run folders.
FOLDER = "fallback-calls"
#: Where the fallback reproducer is written.
REPRO_FOLDER = "fallback-repro"


@dataclass(frozen=True)
class Fallbacks:
    """What the capture found.

    Attributes:
        calls: each distinct call of an op that fell back, in words (``aten::cumsum(bfloat16[1, 7], -1) x3``).
        script: the reproducer's path, None when none was written.
        note: how the calls were captured, or why they were not.
    """

    calls: tuple[str, ...]
    script: Path | None
    note: str


def capture_fallbacks(job: Job, spec: RunSpec, ops: Sequence[str]) -> Fallbacks:
    """Rerun ``spec`` (a device run whose fallback list named ``ops``) eagerly with the recorder, in :data:`FOLDER`,
    and write the reproducer of the calls it recorded."""
    outcome = job.rerun_on_device(replace(spec, compile=False, capture_fallbacks=tuple(ops)), FOLDER)
    if outcome is None:
        return Fallbacks((), None, "not captured: no lease to run the device again on")
    result = outcome.result or {}
    if not result.get("ok"):
        stage = result.get("stage") or outcome.last_stage
        why = scrub(str(result.get("error") or "no result"), job.environ) or ""
        return Fallbacks((), None, f"not captured: the eager rerun failed at {stage}: {why[:300]}")
    calls = [call for call in result.get("fallback_calls") or () if isinstance(call, dict)]
    if not calls:
        return Fallbacks((), None, f"not captured: the eager rerun made no call of {', '.join(ops)}")
    # One process, no ranks: each call alone, on one core.
    reproducer = replace(spec, world_size=1, distributed_configs=(), replay_fallbacks=tuple(calls))
    script = write_atomic(job.workdir / REPRO_FOLDER / "run.py", render(reproducer))
    seconds = float(result.get("wall_s") or 0.0)
    ranks = f", rank 0's of {job.plan.cores}" if job.sharded else ""
    note = (
        f"recorded on an eager rerun ({seconds:.1f} s{ranks}): {len(calls)} distinct call(s) of {', '.join(ops)}; "
        "python3 run.py --out result.json (on the device) makes each alone and says whether it fell back"
    )
    words = tuple(scrub(str(call.get("words") or call.get("op")), job.environ) or "" for call in calls)
    return Fallbacks(words, script, note)
