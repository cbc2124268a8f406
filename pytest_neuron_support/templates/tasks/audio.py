"""run.py's inputs for speech (``automatic-speech-recognition``): the processor (feature extractor and
tokenizer) and a fixed waveform this script synthesises itself (SPEC["task_options"]["audio"]: a few
tones with smooth envelopes, from arithmetic alone, identical on every machine), turned into the
model's input features by the checkpoint's own feature extractor.

Spliced into run.py before the generation fragment (see text.py).
"""

from __future__ import annotations

from run import SPEC

# isort: split
# @@TASK@@
import math

#: Speech models need their processor (feature extractor + tokenizer), not just a tokenizer.
PREPROCESSOR = "AutoProcessor"


def fixed_audio(torch):
    """The test waveform: each tone ``[frequency, start, end]`` (Hz, seconds) under a half-sine envelope,
    at the spec's sample rate, as float32 samples (what feature extractors take)."""
    audio = SPEC["task_options"]["audio"]
    rate = audio["sample_rate"]
    t = torch.arange(int(audio["seconds"] * rate), dtype=torch.float64) / rate
    wave = torch.zeros_like(t)
    for frequency, start, end in audio["tones"]:
        inside = ((t >= start) & (t < end)).to(torch.float64)
        envelope = inside * torch.sin(math.pi * (t - start).clamp(min=0) / (end - start)).abs()
        wave += audio["amplitude"] * envelope * torch.sin(2 * math.pi * frequency * t)
    return wave.to(torch.float32)


def task_inputs(torch, preprocessor, model):
    """(inputs on the model's device, tokenizer): the waveform through the checkpoint's feature extractor,
    its features in the weights' dtype, as a user passes them.

    Unlike a decoder's prompt, the encoder's inputs must be put on the device here: generate() moves
    inputs only for the decoder's forward, and the encoder (Whisper's conv front end, and
    detect_language before the decoder prompt exists) gets them as given. torch-neuronx's eager path
    moves only 0-dim CPU tensors, so a CPU input_features either raises at the first conv or runs it on
    the host (shared/reference/torchneuron.md, third reading); the pipeline check's pipeline moves them
    itself, so both checks of one model feed the device alike. The features have a fixed shape (the
    extractor pads to 30 s), so placing them cannot change a compiled graph's shapes."""
    audio = SPEC["task_options"]["audio"]
    wave = fixed_audio(torch).numpy()
    inputs = preprocessor(wave, sampling_rate=audio["sample_rate"], return_tensors="pt")
    for key, value in inputs.items():
        if value.is_floating_point():
            inputs[key] = value.to(device=model.device, dtype=model.dtype)
        else:
            inputs[key] = value.to(model.device)
    return inputs, preprocessor.tokenizer


def pipeline_call(torch, pipe, kwargs):
    """The pipeline check's call: the same waveform with its sample rate, as a user hands a pipeline audio."""
    rate = SPEC["task_options"]["audio"]["sample_rate"]
    return pipe({"raw": fixed_audio(torch).numpy(), "sampling_rate": rate}, generate_kwargs=kwargs)
