"""Sentence embeddings (``feature-extraction``, ``sentence-similarity``): a fixed list of sentences
embedded with the pooling the checkpoint's sentence-transformers files declare.

run.py compiles the encoder's forward pass with the device's backend and runs it twice (the second must
repeat the first). The CPU reference embeds the same sentences in float32 and again in the device's
dtype. The verdict: every sentence's device embedding within the calibrated tolerance of the float32 one
(``verdict.tolerance``: its distance against the CPU's own dtype noise), and pointing the way it does,
cosine similarity at least the entry's ``min_cosine`` (default ``verdict.embeddings.DEFAULT_MIN_COSINE``).
The reference runs beside the device run, sharded or not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, ClassVar

from pytest_neuron_support.base.model import ModelSpec
from pytest_neuron_support.cpu.reference import ReferenceRun
from pytest_neuron_support.data.records import Row
from pytest_neuron_support.run.context import Job
from pytest_neuron_support.run.runscript import RunSpec
from pytest_neuron_support.run.settings import Settings
from pytest_neuron_support.tasks.task import Task
from pytest_neuron_support.verdict import decide
from pytest_neuron_support.verdict.embeddings import (
    DEFAULT_MIN_COSINE,
    EmbeddingParity,
    calibrated_embeddings,
    compare_embeddings,
)
from pytest_neuron_support.verdict.tolerance import row_fields

#: What embedding tasks embed: short and long, punctuation, digits, casing and non-ASCII, so the
#: batch is padded (the pooling mask matters) and the tokenizer's edge cases are exercised.
EMBEDDING_SENTENCES: tuple[str, ...] = (
    "The history of the printing press begins in the fifteenth century.",
    "A man is playing a guitar.",
    "Someone is playing an instrument on stage.",
    "The cat sits on the warm windowsill and watches the birds outside, ignoring the dog.",
    "Stock markets fell 3.2% on Tuesday after the announcement.",
    "How do I reset my password?",
    "Café au lait costs €4 in Paris; naïve tourists pay more.",
    "AWS Trainium runs PyTorch models through TorchNeuron.",
)


def min_cosine_of(model: ModelSpec) -> float:
    """The cosine threshold of an embedding entry: its ``min_cosine``, else the default."""
    return DEFAULT_MIN_COSINE if model.min_cosine is None else model.min_cosine


def cosine_parity(model: ModelSpec, result: Mapping[str, Any], reference: Mapping[str, Any]) -> EmbeddingParity:
    """Each sentence's device embedding against the CPU's, at the entry's threshold."""
    return compare_embeddings(result.get("embeddings") or (), reference.get("embeddings") or (), min_cosine_of(model))


def with_cosines(row: Row, parity: EmbeddingParity) -> Row:
    """The cosine evidence into the row's columns."""
    return replace(
        row,
        reference_match=parity.match,
        min_cosine=None if parity.min_cosine is None else round(parity.min_cosine, 8),
        cosine_threshold=parity.threshold,
    )


class SentenceEmbedding(Task):
    """The tokenizer and ``AutoModel``; the sentences of :data:`EMBEDDING_SENTENCES`."""

    auto_class = "AutoModel"
    # AutoModel maps every architecture transformers has (622 in 5.24): no registry says which of them
    # make sentence embeddings, so coverage does not track this task.
    registry = None
    inputs: ClassVar[str] = "embedding"
    code = ("embedding.py",)
    takes_prompt: ClassVar[bool] = False
    fixed_input: ClassVar[str] = "it embeds a fixed set of sentences"
    cosine: ClassVar[bool] = True
    generates: ClassVar[bool] = False
    # Sentence embeddings are what sentence-transformers is for, not a transformers pipeline.
    pipeline: ClassVar[bool] = False
    trainable: ClassVar[bool] = False  # no language-modelling head to train

    def prompt(self, model: ModelSpec, default: str) -> str | None:
        return None  # it embeds fixed sentences

    def hash_parts(self, model: ModelSpec) -> list[str]:
        return [repr(min_cosine_of(model)), *EMBEDDING_SENTENCES]

    def spec_fields(self, model: ModelSpec, reference: bool) -> dict[str, Any]:
        # The CPU reference embeds in float32 and again in the device's dtype (the calibrated rule's two CPU
        # outputs); reference_dtype (its float32) says so in the row.
        options = {"noise_dtype": model.dtype} if reference else {}
        return {"sentences": EMBEDDING_SENTENCES, "task_options": options}

    def run_spec(self, model: ModelSpec, settings: Settings, **kwargs: Any) -> RunSpec:
        spec = super().run_spec(model, settings, **kwargs)
        return replace(spec, dtype="float32") if kwargs.get("reference") else spec

    def repeat(self, row: Row, result: Mapping[str, Any]) -> decide.Decision | None:
        if row.repeat_identical is not False:
            return None
        return decide.repeat_differs((), None, None, outputs="embeddings")

    def free_reference(self, sharded: bool) -> bool:
        return True  # the embeddings are what the verdict compares, sharded or not

    def compare(self, row: Row, model: ModelSpec, result: Mapping[str, Any], reference: Mapping[str, Any]) -> Row:
        return with_cosines(row, cosine_parity(model, result, reference))

    def decide(self, job: Job, row: Row, result: Mapping[str, Any], reference: ReferenceRun | None) -> Row:
        assert reference is not None
        row, cpu = self.reference_of(row, result, reference)
        if cpu is None:
            return row
        parity = cosine_parity(job.model, result, cpu)
        checked = calibrated_embeddings(
            result.get("embeddings") or (), cpu.get("embeddings") or (), cpu.get("noise_embeddings") or ()
        )
        decision = decide.numeric(checked, "embedding-calibrated", "embeddings")
        stated = decide.embeddings(parity)  # within the dtype's noise, the entry's stated cosine must hold too
        if decision.result == "PASS" and stated.result != "PASS":
            decision = stated
        row = replace(with_cosines(row, parity), **row_fields(checked))
        return replace(row, reference_match=checked.match and parity.match, **decision.fields())
