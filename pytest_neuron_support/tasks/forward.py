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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
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

#: What a zero-shot classifier classifies: three of :data:`SENTENCES` (short enough that each, paired with every
#: hypothesis, fits :data:`LENGTH`), each paired with every :data:`CANDIDATE_LABELS` hypothesis.
ZERO_SHOT_SENTENCES: tuple[str, ...] = (SENTENCES[0], SENTENCES[2], SENTENCES[4])
#: The candidate labels a zero-shot classifier is asked about (each through the hypothesis template).
CANDIDATE_LABELS: tuple[str, ...] = ("complaint", "question", "animals")
#: transformers' zero-shot pipeline's default hypothesis.
HYPOTHESIS_TEMPLATE = "This example is {}."
#: What a zero-shot image classifier is asked about: what the test card shows, and two things it does not.
IMAGE_CANDIDATE_LABELS: tuple[str, ...] = ("a test card", "a mirrored test card", "a cat")
#: transformers' zero-shot image pipeline's default hypothesis.
IMAGE_HYPOTHESIS_TEMPLATE = "This is a photo of {}."

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

#: The most pixels a side a segmentation's items are read at: a larger map (UperNet's logits come at the input's
#: 512x512) is read at every n-th pixel, the same grid on both sides, so the items stay a few thousand.
PIXEL_GRID = 32


#: The input fragment of each kind of input (templates/tasks/): its preprocessor class and fixed input.
INPUT_FRAGMENTS: Mapping[str, str] = MappingProxyType({"text": "text.py", "image": "vision.py", "audio": "audio.py"})


#: What a forward task's items can be (run.py's ``read_items`` reads each): one per input, one per word-piece, one
#: per mask token, one per position of a ``[batch, position, score]`` output, one per pixel of a
#: ``[batch, score, height, width]`` output.
ITEMS: tuple[str, ...] = ("sequence", "tokens", "mask", "positions", "pixels")


@dataclass(frozen=True)
class Reading:
    """What a forward task feeds its model and how its output is read.

    Attributes:
        output: the model output's attribute holding the scores (``logits``), or the numbers a task without a
            decision returns (``last_hidden_state``, ``predicted_depth``).
        items: which of its vectors are items (:data:`ITEMS`): ``sequence`` (one per input, the whole of the
            input's output), ``tokens`` (one per word-piece, special tokens left out), ``mask`` (one per mask
            token), ``positions`` (one per index of the output's second axis: a detection query) or ``pixels``
            (one per spatial position of a ``[batch, class, height, width]`` output: a segmentation's pixel).
        inputs: ``text`` (:attr:`sentences`, padded to :data:`LENGTH`), ``image`` (run.py's test card and its
            mirror image) or ``audio`` (run.py's waveform, :data:`~.speech.AUDIO`, and the same samples reversed).
        sentences: the fixed sentences of a text task (``{mask}`` marks a fill-mask sentence's mask).
        preprocessor: the transformers Auto class run.py loads the preprocessor with, as the task's pipeline
            does (``AutoFeatureExtractor``); None: its input fragment's (a tokenizer, or ``AutoProcessor``).
        decides: whether each item's top-1 is the task's decision (a class, a tag, a word); False where the
            output is numbers only (features, a depth map), checked by the calibrated tolerance alone.
        also: further outputs checked by the calibrated tolerance only, read into items the same way (a
            detector's ``pred_boxes``, one box per query).
        pipeline_keywords: what the pipeline check passes the task's pipeline beside an image or a waveform
            (``{"top_k": 1}``: the top label, which the direct path's decision is).
        candidate_labels: a zero-shot classifier's labels: each sentence is paired with each label's hypothesis
            (:attr:`hypothesis_template`), as transformers' zero-shot pipeline pairs them, and each pair is an
            item (its decision: entailment, neutral or contradiction); a zero-shot image classifier is given
            every label's hypothesis beside each image, whose item is its score per label (its decision: the
            label).
        hypothesis_template: the hypothesis each candidate label is written into.
        numbers_per: what the calibrated tolerance judges as one comparison: ``item`` (each item's vector), or
            ``input`` (every item of one input, its vectors joined: a CTC recogniser's frames). Where an input has
            many items of a few scores each, one item's dtype noise is a small sample and the largest of a hundred
            ratios of two such samples reaches the rule's multiple on a healthy run (a tiny wav2vec2's 148 frames
            of 32 characters: every input's ratio 1.0, one frame's 3.2); an input's whole output is the sample
            the rule is calibrated on (a sentence's embedding), and each item's decision is still checked.
    """

    output: str
    items: str
    inputs: str = "text"
    sentences: tuple[str, ...] = ()
    preprocessor: str | None = None
    decides: bool = True
    also: tuple[str, ...] = ()
    pipeline_keywords: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    candidate_labels: tuple[str, ...] = ()
    hypothesis_template: str = HYPOTHESIS_TEMPLATE
    numbers_per: str = "item"

    def __post_init__(self) -> None:
        if self.items not in ITEMS:
            raise ValueError(f"Reading.items = {self.items!r}: one of {', '.join(ITEMS)}")
        if self.numbers_per not in ("item", "input"):
            raise ValueError(f"Reading.numbers_per = {self.numbers_per!r}: item or input")

    @property
    def outputs(self) -> tuple[str, ...]:
        """Every output the verdict compares: the scores first, then :attr:`also`."""
        return (self.output, *self.also)


class ForwardTask(Task):
    """A task whose model runs one forward pass (see the module): one instance per row of the table."""

    inputs: ClassVar[str] = "forward"
    takes_prompt: ClassVar[bool] = False
    fixed_input: ClassVar[str] = "it runs one forward pass over fixed inputs (sentences, a test card, a waveform)"
    generates: ClassVar[bool] = False
    # Each has a transformers pipeline users reach for: the pipeline check applies (forward_pipeline.py).
    pipeline: ClassVar[bool] = True
    trainable: ClassVar[bool] = False  # train.py trains causal language modelling only

    def __init__(
        self, name: str, auto_class: str, registry: str | None, reading: Reading, pipeline_tag: str | None = None
    ) -> None:
        super().__init__(name, pipeline_tag)
        self.auto_class = auto_class
        # None: the task's architectures are another row's registry's (a zero-shot classifier is a sequence
        # classifier trained on NLI), which coverage reads there.
        self.registry = None if registry is None else ("transformers.models.auto.modeling_auto", registry)
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
        # What run.py is told to read (task_options: the output, the items, the inputs, the waveform, the
        # length) and the sentences it reads them from.
        return [json.dumps(self.task_options(), sort_keys=True), *self.reading.sentences]

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
        if not self.reading.decides:
            options["decides"] = False
        if self.reading.also:
            options["also"] = list(self.reading.also)
        if self.reading.pipeline_keywords:
            options["pipeline_keywords"] = dict(self.reading.pipeline_keywords)
        if self.reading.items == "pixels":
            options["pixel_grid"] = PIXEL_GRID
        if self.reading.candidate_labels:
            options["candidate_labels"] = list(self.reading.candidate_labels)
            options["hypothesis_template"] = self.reading.hypothesis_template
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
        device, float32 = result.get("outputs") or (), cpu.get("outputs") or ()
        decisions: Decisions | None = None
        if result.get("items") != cpu.get("items"):
            # The same inputs through the same preprocessor give the same items on both sides: items that differ
            # are the harness's to explain, so nothing is compared (a FAIL that says so, never a PASS).
            problem = (
                f"the device run's items (input, position) are not the CPU reference's ({len(device)} and "
                f"{len(float32)} items): the two runs did not read the same inputs"
            )
            checked = Calibrated((), problem)
            if self.reading.decides:
                decisions = Decisions(0, 0, 0, problem=problem)
        else:
            checked = self.compare_outputs(result, cpu)
            if self.reading.decides:
                decisions = compare_decisions(device, float32, cpu.get("noise_outputs") or ())
        decision = decide.forward(
            checked,
            decisions,
            f"{self.name} {'/'.join(self.reading.outputs)}",
            result.get("decision_labels") or (),
            cpu.get("decision_labels") or (),
        )
        row = replace(row, **row_fields(checked), **decision_fields(decisions))
        matched = checked.match and (decisions is None or decisions.match)
        return replace(row, reference_match=matched, **decision.fields())

    def locate_options(self, row: Row, result: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The task's own fixed inputs: the forward that failed is the one searched."""
        return {"inputs": "the task's fixed inputs"}

    def compare_outputs(self, result: Mapping[str, Any], cpu: Mapping[str, Any]) -> Calibrated:
        """Every output the reading names (the scores, then :attr:`Reading.also`), each item against the CPU's
        float32 one beside the CPU's own in the device's dtype, in one calibrated check (a stage per output)."""
        device = {self.reading.output: result.get("outputs") or (), **(result.get("also_outputs") or {})}
        float32 = {self.reading.output: cpu.get("outputs") or (), **(cpu.get("also_outputs") or {})}
        noise = {self.reading.output: cpu.get("noise_outputs") or (), **(cpu.get("noise_also_outputs") or {})}
        if self.reading.numbers_per == "input":
            device = {name: per_input(v, result.get("items") or ()) for name, v in device.items()}
            float32 = {name: per_input(v, cpu.get("items") or ()) for name, v in float32.items()}
            noise = {name: per_input(v, cpu.get("items") or ()) for name, v in noise.items()}
        checks = [
            calibrated_outputs(name, device.get(name) or (), float32.get(name) or (), noise.get(name) or ())
            for name in self.reading.outputs
        ]
        problems = [c.problem for c in checks if c.problem is not None]
        return Calibrated(tuple(c for check in checks for c in check.comparisons), "; ".join(problems) or None)


def per_input(vectors: Sequence[Sequence[float]], items: Sequence[Sequence[int]]) -> list[list[float]]:
    """Each input's item vectors joined into one, in input order (an item's first index is its input's). Vectors
    and items that do not pair are returned as they are: the comparison then names the count that differs."""
    if len(vectors) != len(items):
        return [list(v) for v in vectors]
    joined: dict[int, list[float]] = {}
    for vector, item in zip(vectors, items, strict=True):
        joined.setdefault(int(item[0]), []).extend(vector)
    return [joined[index] for index in sorted(joined)]


def decision_fields(decisions: Decisions | None) -> dict[str, Any]:
    """The decision evidence, in the row's generic disagreement columns (an item for a position); none for a
    task whose output is numbers only."""
    if decisions is None:
        return {}
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
