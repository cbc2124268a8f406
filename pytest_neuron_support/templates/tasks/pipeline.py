"""run.py's loading for the pipeline check (a row's ``check`` is ``pipeline``): the model through
``transformers.pipeline(<task>, model=<id>, device=<device>)``, the way the Transformers guide's second
recipe puts a model on the device, instead of ``from_pretrained(device_map=<device>)``.

The pipeline's task is SPEC["task_options"]["pipeline_task"] (the row's Hub pipeline tag: a CTC speech
recogniser's row asks for ``automatic-speech-recognition``, as Whisper's does). Its placement arguments are
SPEC["task_options"]["pipeline"] (``{"device": "neuron"}``), so the
file says how the pipeline was asked. Where the model then sits (every parameter's and buffer's device type,
and the pipeline's own ``device``) is read by pipeline_call.py's ``run_task`` right before the run, after
the session's post-load hook, so it is where the model is when it runs. A pipeline that left the model
anywhere but on the asked device (the guide warns that ``device_map="auto"`` silently loads on CPU:
Accelerate sees no neuron device), or a hook that moved part of it off, is not run at all: the result says
where the model is, and the check FAILs it.

Spliced into run.py (pytest-neuron-support's runscript) before the task's own fragments and
pipeline_call.py, in place of run.py's @@TASK@@ import; see transformers.py.
"""

from __future__ import annotations

from run import SPEC

# isort: split
# @@TASK@@
import itertools


def placement(pipe):
    """Where the pipeline put its model: the device types of every parameter and buffer, and the
    pipeline's own device."""
    model = pipe.model
    tensors = itertools.chain(model.parameters(), model.buffers())
    return {"model_devices": sorted({t.device.type for t in tensors}), "pipeline_device": str(pipe.device)}


def load(torch, facts):
    """(the pipeline, its model): ``transformers.pipeline`` with the task, the checkpoint, the dtype and
    SPEC's placement arguments (where it put the model is read before the run: pipeline_call.py)."""
    import transformers

    if SPEC["distributed_configs"]:
        raise NotImplementedError("a pipeline runs in one process on one device: the planner gives it a single core")
    pipe = transformers.pipeline(
        SPEC["task_options"]["pipeline_task"],
        model=SPEC["model"],
        revision=SPEC["revision"],
        trust_remote_code=SPEC["trust_remote_code"],
        dtype=getattr(torch, SPEC["dtype"]),
        **SPEC["task_options"]["pipeline"],
    )
    facts["pipeline_class"] = type(pipe).__name__
    pipe.model.eval()
    return pipe, pipe.model
