"""Speech recognition (``automatic-speech-recognition``): an encoder-decoder that transcribes audio
(Whisper), through the same generation path and verdict as text generation.

run.py feeds the checkpoint's own processor a fixed waveform it synthesises itself
(``templates/tasks/audio.py``: a few tones, from arithmetic alone), and generates the transcript with
``generate()`` and a static cache, compiled, twice. The encoder's input features go on the model's device in
its dtype (generate() moves inputs only for the decoder). The decoder prompt generate() built (start of
transcript, then the language, task and timestamp tokens, a language it detected from the audio
included) must equal the free-running CPU run's: a different one FAILs at stage ``prompt``
(``decide.decoder_prompt``), naming both. The decoder's tokens are checked as a text generation's are:
exact parity with a free-running CPU run (one core) and the teacher-forced CPU check of every token after
the device run's own decoder prompt.
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

#: The audio every run transcribes: 1.5 s at 16 kHz of three overlapping tones under half-sine envelopes
#: (frequency, start, end). Speech it is not; what the check compares is what the device and the CPU
#: make of the same samples, through the checkpoint's own feature extractor and decoder.
AUDIO: Mapping[str, Any] = {
    "seconds": 1.5,
    "sample_rate": 16000,
    "amplitude": 0.3,
    "tones": [[440.0, 0.0, 0.6], [660.0, 0.5, 1.1], [330.0, 1.0, 1.5]],
}


class SpeechRecognition(TextGeneration):
    """``AutoModelForSpeechSeq2Seq`` and its processor; the waveform of :data:`AUDIO`."""

    auto_class = "AutoModelForSpeechSeq2Seq"
    registry = (
        "transformers.models.auto.modeling_auto",
        "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",
    )
    inputs: ClassVar[str] = "audio"
    code = ("audio.py", "generation.py")
    takes_prompt: ClassVar[bool] = False
    fixed_input: ClassVar[str] = "it transcribes a fixed waveform it synthesises itself"
    # train.py fine-tunes a causal LM on text; a speech model's loss needs audio features.
    trainable: ClassVar[bool] = False

    def prompt(self, model: ModelSpec, default: str) -> str | None:
        return None  # it transcribes audio; there is no text prompt

    def hash_parts(self, model: ModelSpec) -> list[str]:
        return [json.dumps(dict(AUDIO), sort_keys=True)]

    def spec_fields(self, model: ModelSpec, reference: bool) -> dict[str, Any]:
        return {**super().spec_fields(model, reference), "task_options": {"audio": dict(AUDIO)}}

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
    ``<|notimestamps|>``), from its ``tokenizer.json`` where it is at hand (a local folder, or the Hugging
    Face cache: never a request), so a prompt's error names them; empty where it is not."""
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
