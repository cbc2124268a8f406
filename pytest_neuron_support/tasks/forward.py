"""Forward tasks: one compiled forward pass on fixed, static-shaped inputs, its raw outputs and the
decision read from them checked against the CPU's. One module serves every such task; a task of this
kind is one row of the task table (``tasks/table.py``) naming its Auto class, its registry, its fixed
sentences, which output holds the numbers and how its decision is read (:class:`Reading`).

run.py (``templates/tasks/forward.py``, after its input kind's fragment) builds the task's fixed inputs in one
static shape (sentences padded to one length, the test card, the waveform), compiles
the model's forward pass with the device's backend and runs it twice (the second must repeat the first),
and writes each item's scores (an input's, a token's or a mask's logits) and its decision (their top-1,
named as the checkpoint names it). The CPU reference runs the same forward eagerly in float32 and again in
the device's dtype. The verdict (``verdict.decide.forward``): every item's scores within the calibrated
tolerance of float32 (``verdict.tolerance``), and every decision the CPU is decisive about the same on the
device (``verdict.decisions``: a differing near-tie is reported, not failed). The reference runs beside
the device run, sharded or not: the outputs are what the verdict compares.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, ClassVar

from pytest_neuron_support.base.model import ModelSpec
from pytest_neuron_support.cpu.reference import ReferenceRun
from pytest_neuron_support.data.records import Row
from pytest_neuron_support.run.context import Job
from pytest_neuron_support.run.runscript import RunSpec
from pytest_neuron_support.run.settings import Settings
from pytest_neuron_support.tasks.speech import AUDIO
from pytest_neuron_support.tasks.task import Task
from pytest_neuron_support.verdict import decide
from pytest_neuron_support.verdict.decisions import Decisions, compare_decisions
from pytest_neuron_support.verdict.tolerance import Calibrated, calibrated_outputs, row_fields

#: What a classification task classifies (each sentence, or each of its word-pieces): plain and
#: punctuated, a name, a place and an organisation (what a token classifier tags), digits and casing.
SENTENCES: tuple[str, ...] = (
    "The quick brown fox jumps over a lazy dog.",
    "I loved this film, the acting was wonderful!",
    "The service was slow and the food arrived cold.",
    "Angela Merkel visited the Amazon offices in Seattle on Tuesday.",
    "How do I reset my password?",
    "AWS Trainium runs PyTorch models through TorchNeuron.",
)

#: What a fill-mask task fills: ``{mask}`` is written as the tokenizer's own mask token.
MASKED_SENTENCES: tuple[str, ...] = (
    "The quick brown fox jumps over a lazy {mask}.",
    "The capital of France is {mask}.",
    "I loved this film, the acting was {mask}!",
    "How do I reset my {mask}?",
)

#: Word-pieces every sentence is padded to: one static shape, so the forward compiles once. Long enough for
#: every sentence above in the tiny zoo's small vocabulary (42 word-pieces at most), so nothing is cut and a
#: pipeline's own call sees the same tokens; run.py stops at load (before compiling) when a sentence fills
#: every position, since it may have been cut.
LENGTH = 48


#: The input fragment of each kind of input (templates/tasks/): its preprocessor class and fixed input.
INPUT_FRAGMENTS: Mapping[str, str] = MappingProxyType({"text": "text.py", "image": "vision.py", "audio": "audio.py"})


@dataclass(frozen=True)
class Reading:
    """What a forward task feeds its model and how its output is read.

    Attributes:
        output: the model output's attribute holding the scores (``logits``).
        items: which of its vectors are items: ``sequence`` (one per input), ``tokens`` (one per
            word-piece, special tokens left out) or ``mask`` (one per mask token).
        inputs: ``text`` (:attr:`sentences`, padded to :data:`LENGTH`), ``image`` (run.py's test card and its
            mirror image) or ``audio`` (run.py's waveform, :data:`~.speech.AUDIO`, and the same samples reversed).
        sentences: the fixed sentences of a text task (``{mask}`` marks a fill-mask sentence's mask).
        preprocessor: the transformers Auto class run.py loads the preprocessor with, as the task's pipeline
            does (``AutoFeatureExtractor``); None: its input fragment's (a tokenizer, or ``AutoProcessor``).
    """

    output: str
    items: str
    inputs: str = "text"
    sentences: tuple[str, ...] = ()
    preprocessor: str | None = None


class ForwardTask(Task):
    """A task whose model runs one forward pass (see the module): one instance per row of the table."""

    inputs: ClassVar[str] = "forward"
    takes_prompt: ClassVar[bool] = False
    fixed_input: ClassVar[str] = "it runs one forward pass over fixed inputs (sentences, a test card, a waveform)"
    generates: ClassVar[bool] = False
    # Each has a transformers pipeline users reach for: the pipeline check applies (forward_pipeline.py).
    pipeline: ClassVar[bool] = True
    trainable: ClassVar[bool] = False  # train.py trains causal language modelling only

    def __init__(self, name: str, auto_class: str, registry: str, reading: Reading) -> None:
        super().__init__(name)
        self.auto_class = auto_class
        self.registry = ("transformers.models.auto.modeling_auto", registry)
        self.reading = reading
        # The input kind's fragment (its preprocessor and fixed input), then the forward pass.
        self.code = (INPUT_FRAGMENTS[reading.inputs], "forward.py")

    @property
    def pipeline_fragments(self) -> tuple[str, ...]:
        """The pipeline check's run.py: loading through ``transformers.pipeline``, the input kind's fragment and
        the forward's reading, then the pipeline's call (which replaces the direct path's run)."""
        return ("pipeline.py", *self.code, "forward_pipeline.py")

    def prompt(self, model: ModelSpec, default: str) -> str | None:
        return None  # it runs fixed inputs

    def hash_parts(self, model: ModelSpec) -> list[str]:
        audio = json.dumps(dict(AUDIO), sort_keys=True) if self.reading.inputs == "audio" else ""
        return [
            self.reading.output,
            self.reading.items,
            self.reading.inputs,
            str(LENGTH),
            audio,
            *self.reading.sentences,
        ]

    def task_options(self) -> dict[str, Any]:
        """run.py's ``SPEC["task_options"]`` for this task (the zoo trains its models on the same inputs)."""
        options: dict[str, Any] = {
            "output": self.reading.output,
            "read": self.reading.items,
            "input": self.reading.inputs,
            "length": LENGTH,
        }
        if self.reading.preprocessor:
            options["preprocessor"] = self.reading.preprocessor
        if self.reading.inputs == "audio":
            options["audio"] = dict(AUDIO)
        return options

    def spec_fields(self, model: ModelSpec, reference: bool) -> dict[str, Any]:
        options = self.task_options()
        if reference:
            # The CPU reference runs in float32 and again in the device's dtype (the calibrated rule's two CPU
            # outputs); reference_dtype (its float32) says so in the row.
            options["noise_dtype"] = model.dtype
        return {"sentences": self.reading.sentences, "task_options": options}

    def run_spec(self, model: ModelSpec, settings: Settings, **kwargs: Any) -> RunSpec:
        spec = super().run_spec(model, settings, **kwargs)
        return replace(spec, dtype="float32") if kwargs.get("reference") else spec

    def repeat(self, row: Row, result: Mapping[str, Any]) -> decide.Decision | None:
        if row.repeat_identical is not False:
            return None
        return decide.repeat_differs((), None, None, outputs="outputs")

    def free_reference(self, sharded: bool) -> bool:
        return True  # the outputs are what the verdict compares, sharded or not

    def decide(self, job: Job, row: Row, result: Mapping[str, Any], reference: ReferenceRun | None) -> Row:
        assert reference is not None
        row, cpu = self.reference_of(row, result, reference)
        if cpu is None:
            return row
        device, float32, noise = result.get("outputs") or (), cpu.get("outputs") or (), cpu.get("noise_outputs") or ()
        if result.get("items") != cpu.get("items"):
            # The same inputs through the same preprocessor give the same items on both sides: items that differ
            # are the harness's to explain, so nothing is compared (a FAIL that says so, never a PASS).
            problem = (
                f"the device run's items (input, position) are not the CPU reference's ({len(device)} and "
                f"{len(float32)} items): the two runs did not read the same inputs"
            )
            checked, decisions = Calibrated((), problem), Decisions(0, 0, 0, problem=problem)
        else:
            checked = calibrated_outputs(self.reading.output, device, float32, noise)
            decisions = compare_decisions(device, float32, noise)
        decision = decide.forward(
            checked,
            decisions,
            f"{self.name} {self.reading.output}",
            result.get("decision_labels") or (),
            cpu.get("decision_labels") or (),
        )
        row = replace(row, **row_fields(checked), **decision_fields(decisions))
        return replace(row, reference_match=checked.match and decisions.match, **decision.fields())


def decision_fields(decisions: Decisions) -> dict[str, Any]:
    """The decision evidence, in the row's generic disagreement columns (an item for a position)."""
    return {
        "positions_checked": decisions.checked,
        "positions_disagreeing": decisions.disagreeing,
        "first_disagreement": decisions.first,
        "disagreement_device_token": decisions.device,
        "disagreement_cpu_token": decisions.cpu,
        "disagreements_near_tie": decisions.near_ties_only,
        # A PASS whose decisions differ only at near-ties says so, as a generation near-tie PASS does.
        "near_tie": True if decisions.near_ties_only else None,
    }
