"""run.py's loading for a diffusers pipeline: ``DiffusionPipeline.from_pretrained`` in the spec's
dtype, moved whole onto the device the way diffusers documents it for Neuron (``.to("neuron")``;
diffusers draws its random tensors on CPU for that device itself).

Spliced into run.py (pytest-neuron-support's runscript) before the task's own fragment, in place of
run.py's @@TASK@@ import; what is above the marker line is not spliced (it names what the code uses
from run.py, so ruff checks this file as the code it becomes).
"""

from __future__ import annotations

from run import SPEC

# isort: split
# @@TASK@@


def load(torch, facts):
    """(no preprocessor: the pipeline tokenizes its prompt itself, the pipeline) on the device."""
    import diffusers

    if SPEC["distributed_configs"]:
        raise NotImplementedError("run.py shards no diffusers pipeline: the planner gives one a single core")
    pipeline_class = getattr(diffusers, SPEC["auto_class"])
    pipe = pipeline_class.from_pretrained(
        SPEC["model"],
        revision=SPEC["revision"],
        torch_dtype=getattr(torch, SPEC["dtype"]),
        trust_remote_code=SPEC["trust_remote_code"],
    )
    pipe.set_progress_bar_config(disable=True)
    facts["pipeline_class"] = type(pipe).__name__
    return None, pipe.to(SPEC["device"]["device_map"])
