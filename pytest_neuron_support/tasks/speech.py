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
the device run's own decoder prompt. It is :mod:`.text2text`'s encoder-decoder generation with audio on the
encoder side: that module holds the decoder prompt's check.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar

from pytest_neuron_support.base.model import ModelSpec
from pytest_neuron_support.tasks.text2text import Text2TextGeneration

#: The audio every run transcribes: 1.5 s at 16 kHz of three overlapping tones under half-sine envelopes
#: (frequency, start, end). Speech it is not; what the check compares is what the device and the CPU
#: make of the same samples, through the checkpoint's own feature extractor and decoder.
AUDIO: Mapping[str, Any] = {
    "seconds": 1.5,
    "sample_rate": 16000,
    "amplitude": 0.3,
    "tones": [[440.0, 0.0, 0.6], [660.0, 0.5, 1.1], [330.0, 1.0, 1.5]],
}


class SpeechRecognition(Text2TextGeneration):
    """``AutoModelForSpeechSeq2Seq`` and its processor; the waveform of :data:`AUDIO` on the encoder side (its
    decoder prompt and tokens checked as an encoder-decoder's are)."""

    auto_class = "AutoModelForSpeechSeq2Seq"
    registry = (
        "transformers.models.auto.modeling_auto",
        "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",
    )
    inputs: ClassVar[str] = "audio"
    code = ("audio.py", "generation.py")
    takes_prompt: ClassVar[bool] = False
    fixed_input: ClassVar[str] = "it transcribes a fixed waveform it synthesises itself"
    # transformers' automatic-speech-recognition pipeline: the pipeline check applies.
    pipeline: ClassVar[bool] = True
    # train.py fine-tunes a causal LM on text; a speech model's loss needs audio features.
    trainable: ClassVar[bool] = False

    def prompt(self, model: ModelSpec, default: str) -> str | None:
        return None  # it transcribes audio; there is no text prompt

    def hash_parts(self, model: ModelSpec) -> list[str]:
        return [json.dumps(dict(AUDIO), sort_keys=True)]

    def spec_fields(self, model: ModelSpec, reference: bool) -> dict[str, Any]:
        return {**super().spec_fields(model, reference), "task_options": {"audio": dict(AUDIO)}}
