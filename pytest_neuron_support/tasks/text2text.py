"""Encoder-decoder generation (``text2text-generation``): T5, FLAN-T5, BART, Marian, through ``generate()``
with the prompt on the encoder side, and the same generation path and token verdict as text generation.

run.py tokenizes the prompt, generates with ``generate()`` and a static cache, compiled, twice (the
generation fragment is text generation's: it reads an encoder-decoder's output after its decoder prompt).
The decoder prompt generate() built (the decoder start token; Whisper's start of transcript, language, task
and timestamp tokens) must equal the free-running CPU run's: a different one FAILs at stage ``prompt``
(``decide.decoder_prompt``), naming both. The decoder's tokens are checked as a text generation's are: exact
parity with a free-running CPU run (one core) and the teacher-forced CPU check of every token after the
device run's own decoder prompt (the encoder fed the same prompt). Speech recognition (:mod:`.speech`) is
this task with audio on the encoder side.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

from pytest_neuron_support.base.model import ModelSpec
from pytest_neuron_support.cpu.reference import ReferenceRun
from pytest_neuron_support.data.records import Row
from pytest_neuron_support.hub import cached_file
from pytest_neuron_support.run.context import Job
from pytest_neuron_support.tasks.generation import TextGeneration
from pytest_neuron_support.verdict import decide
from pytest_neuron_support.verdict.decide import Decision


class Text2TextGeneration(TextGeneration):
    """``AutoModelForSeq2SeqLM`` and its tokenizer; the prompt on the encoder side."""

    auto_class = "AutoModelForSeq2SeqLM"
    registry = (
        "transformers.models.auto.modeling_auto",
        "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    )
    # transformers 5 removed its text2text-generation, summarization and translation pipelines: users call
    # generate(), which the inference check runs.
    pipeline: ClassVar[bool] = False
    # train.py fine-tunes a causal LM (labels are the inputs shifted); a seq2seq loss needs target texts.
    trainable: ClassVar[bool] = False

    def decide(self, job: Job, row: Row, result: Mapping[str, Any], reference: ReferenceRun | None) -> Row:
        """Text generation's verdict, then the decoder prompt against the free-running CPU reference's
        (one core: a sharded run has none to compare with): a different prompt FAILs at ``prompt``."""
        row = super().decide(job, row, result, reference)
        cpu = None if reference is None else reference.result
        if cpu is None:  # sharded, or the reference failed (the row says so)
            return row
        then = Decision(row.result, row.failure_stage, row.verdict_basis or "", row.error)
        device_prompt, cpu_prompt = result.get("decoder_prompt_ids"), cpu.get("decoder_prompt_ids")
        decision = decide.decoder_prompt(device_prompt, cpu_prompt, special_tokens(job.model), then)
        return row if decision is then else replace(row, **decision.fields())


def special_tokens(model: ModelSpec) -> dict[int, str]:
    """The text of the checkpoint's added tokens (Whisper's ``<|en|>``, ``<|transcribe|>``,
    ``<|notimestamps|>``; T5's ``<pad>`` decoder start), from its ``tokenizer.json`` where it is at hand (a
    local folder, or the Hugging Face cache: never a request), so a prompt's error names them; empty where it
    is not."""
    folder = Path(model.id)
    try:
        path = (
            folder / "tokenizer.json"
            if folder.is_absolute()
            else cached_file(model.id, "tokenizer.json", revision=model.revision)
        )
        if path is None or not path.is_file():
            return {}
        added = json.loads(path.read_text(encoding="utf-8")).get("added_tokens") or []
        return {int(t["id"]): str(t["content"]) for t in added if isinstance(t, dict) and "id" in t}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return {}  # names are a courtesy: the ids still say which tokens differ
