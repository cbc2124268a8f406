"""run.py's inputs for a text prompt (``text-generation``): the tokenizer, and the prompt as is.

Spliced into run.py (pytest-neuron-support's runscript) before the generation fragment, in place of
run.py's @@TASK@@ import; what is above the marker line is not spliced (it names what the code uses
from run.py, so ruff checks this file as the code it becomes).
"""

from __future__ import annotations

from run import SPEC

# isort: split
# @@TASK@@
#: The class run.py loads the preprocessor with.
PREPROCESSOR = "AutoTokenizer"


def task_inputs(torch, preprocessor, model):
    """(inputs on CPU, tokenizer): the prompt as it is."""
    return preprocessor(SPEC["prompt"], return_tensors="pt"), preprocessor


def pipeline_call(torch, pipe, kwargs):
    """The pipeline check's call: the prompt as it is, the generation settings as the pipeline's keywords."""
    return pipe(SPEC["prompt"], **kwargs)
