"""The vision-language model (image-text-to-text): a tiny llava with an offline processor."""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pytest_neuron_support.zoo.spec import _IMAGE_TOKENS, _TRAIN_SPEC, _VLM_SPEC, TINY_PROMPT, TinyArch
from pytest_neuron_support.zoo.text import (
    _greedy,
    _hub_config,
    _save_decisive,
    _token_ids,
    _train,
    _TrainData,
    _transformers,
)

_ANSWER_MARKER = " ASSISTANT:"


def _test_card(torch_module: Any) -> Any:
    """run.py's own test card (its ``fixed_image``, from the image-text-to-text task's fragment), drawn by
    the template's code itself so the zoo trains and checks on exactly the pixels every run feeds the model."""
    from pytest_neuron_support.run.runscript import TEST_CARD_SIZE, template

    namespace: dict[str, Any] = {"__name__": "neuron_support_run_template"}
    exec(compile(template("run.py", ("vision.py", "generation.py")), "run.py", "exec"), namespace)
    return namespace["fixed_image"](torch_module, *TEST_CARD_SIZE)


def _vlm_processor(tokenizer_dir: Path, out_dir: Path) -> Any:
    """The zoo tokenizer plus ``<image>``, a CLIP image processor and llava-1.5's chat template, saved
    into ``out_dir`` as a Hub repo ships them; returns the processor loaded back from there."""
    from tokenizers import AddedToken

    tf = _transformers()
    # local_files_only said outright: the saved tokenizer_config.json records it, and left to
    # HF_HUB_OFFLINE it would make the checkpoint depend on the builder's environment.
    tokenizer = tf.AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    tokenizer.add_tokens([AddedToken(str(_VLM_SPEC["image_token"]), special=True, normalized=False)])
    size = int(_VLM_SPEC["image_size"])
    image_processor = tf.CLIPImageProcessor(
        size={"shortest_edge": size}, crop_size={"height": size, "width": size}, do_center_crop=True
    )
    processor = tf.LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=int(_VLM_SPEC["patch_size"]),
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,  # CLIP's CLS token, dropped again by the "default" strategy
        chat_template=str(_VLM_SPEC["chat_template"]),
    )
    processor.save_pretrained(str(out_dir))
    return tf.AutoProcessor.from_pretrained(str(out_dir))


def _vlm_inputs(processor: Any, prompt: str, dtype: Any) -> dict[str, Any]:
    """Model inputs exactly as run.py builds them: the chat template around the test card and prompt."""
    import torch

    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = dict(processor(images=[_test_card(torch)], text=[text], return_tensors="pt"))
    inputs["pixel_values"] = inputs["pixel_values"].to(dtype)
    return inputs


def _vlm_batch_fn(processor: Any, data: _TrainData) -> Callable[[random.Random], dict[str, Any]]:
    import torch

    tokenizer = processor.tokenizer
    spec = _VLM_SPEC
    image_id = int(tokenizer.convert_tokens_to_ids(str(spec["image_token"])))
    card = _vlm_inputs(processor, TINY_PROMPT, torch.float32)["pixel_values"][0]
    sentences = [str(tokenizer.decode(list(ids))) for ids in data.sentences]
    preambles = [str(p) for p in _TRAIN_SPEC["preambles"]]
    marker = [int(i) for i in tokenizer(_ANSWER_MARKER)["input_ids"]]
    seq_len = int(spec["seq_len"])
    lo, hi = spec["repeats_before_answer"]

    def encode(text: str) -> list[int]:
        return [int(i) for i in tokenizer(text)["input_ids"]]

    def batch(rng: random.Random) -> dict[str, Any]:
        ids: list[list[int]] = []
        labels: list[list[int]] = []
        pixels = []
        for _ in range(int(spec["batch_size"])):
            # The pieces split where the byte-level pre-tokenizer splits (before a space-prefixed
            # word), so their concatenation is what tokenizing the whole chat text gives.
            head = encode("USER: ") + [image_id] * _IMAGE_TOKENS + encode("\n" + rng.choice(preambles))
            sentence = encode(rng.choice(sentences))
            seq = list(head)
            labelled = [-100] * len(head)
            for _ in range(rng.randint(lo, hi)):
                seq += sentence
                labelled += sentence
            seq += marker
            labelled += [-100] * len(marker)
            while len(seq) < seq_len:
                seq += sentence
                labelled += sentence
            ids.append(seq[:seq_len])
            labels.append(labelled[:seq_len])
            noise = torch.randn(card.shape, generator=torch.Generator().manual_seed(rng.randrange(1 << 31)))
            pixels.append(card if rng.random() < float(spec["test_card_fraction"]) else noise)
        return {"input_ids": torch.tensor(ids), "labels": torch.tensor(labels), "pixel_values": torch.stack(pixels)}

    return batch


def _build_vlm(
    arch: TinyArch, tokenizer_dir: Path, data: _TrainData, fingerprint: str, out_dir: Path
) -> tuple[float, float]:
    import torch

    tf = _transformers()
    processor = _vlm_processor(tokenizer_dir, out_dir)
    tokenizer = processor.tokenizer
    ids = _token_ids(tokenizer)
    image_id = int(tokenizer.convert_tokens_to_ids(str(_VLM_SPEC["image_token"])))
    hub_cfg = _hub_config(arch, len(tokenizer), ids, image_token_id=image_id)
    cfg_dir = out_dir / "_cfg"
    cfg_dir.mkdir(parents=True)
    (cfg_dir / "config.json").write_text(json.dumps(hub_cfg, indent=2) + "\n")
    config = tf.AutoConfig.from_pretrained(str(cfg_dir))
    shutil.rmtree(cfg_dir)

    seed = int(_VLM_SPEC["seed"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = tf.AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
        loss = _train(model, seed, data, _vlm_batch_fn(processor, data), steps=int(_VLM_SPEC["steps"]))

    inputs = _vlm_inputs(processor, TINY_PROMPT, torch.float32)
    extra = {"pixel_values": inputs["pixel_values"]}
    fp32_tokens, gap = _greedy(model, inputs["input_ids"], inputs["attention_mask"], 32, extra=extra)
    model = model.to(torch.bfloat16)
    extra = {"pixel_values": inputs["pixel_values"].to(torch.bfloat16)}
    bf16_tokens, _ = _greedy(model, inputs["input_ids"], inputs["attention_mask"], 32, extra=extra)
    _save_decisive(arch, model, (fp32_tokens, bf16_tokens), loss, gap, hub_cfg, ids, out_dir, fingerprint)
    return loss, gap
