"""Building the text models: the offline tokenizer, the corpus, the copy-task training and the
greedy decisiveness check each checkpoint must pass before it is saved."""

from __future__ import annotations

import copy
import importlib
import json
import math
import random
import shutil
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


from pytest_neuron_support.zoo.spec import (
    _BOS,
    _CHAT_TEMPLATE,
    _EOS,
    _EXTRA_LINES,
    _IM_END,
    _IM_START,
    _PAD,
    _PROMPT_SENTENCE,
    _SPECIAL_TOKENS,
    _TOKENIZER_SPEC,
    _TRAIN_SPEC,
    _UNK,
    _WORDS,
    MIN_BUILD_GAP,
    TINY_PROMPT,
    TinyArch,
    _HFModel,
    _HFTokenizer,
)


def _transformers() -> Any:
    return importlib.import_module("transformers")


def _corpus_lines() -> list[str]:
    rng = random.Random(int(_TOKENIZER_SPEC["corpus_seed"]))
    w = _WORDS

    def np_() -> str:
        parts = [rng.choice(w["det"])]
        for _ in range(rng.choice((0, 1, 1, 2))):
            parts.append(rng.choice(w["adj"]))
        parts.append(rng.choice(w["noun"]))
        return " ".join(parts)

    def clause() -> str:
        subj = rng.choice(w["name"]) if rng.random() < 0.2 else np_()
        out = f"{subj} {rng.choice(w['verb'])} {np_()}"
        if rng.random() < 0.5:
            out += f" {rng.choice(w['prep'])} {np_()}"
        if rng.random() < 0.3:
            out += f" {rng.choice(w['adv'])}"
        return out

    lines = list(_EXTRA_LINES) * 20
    for _ in range(int(_TOKENIZER_SPEC["corpus_sentences"])):
        s = clause()
        if rng.random() < 0.3:
            s += f", {rng.choice(w['conj'])} {clause()}"
        if rng.random() < 0.5:
            s = s[0].upper() + s[1:]
        s += rng.choice((".", ".", ".", "!", "?"))
        if rng.random() < 0.1:
            s += f" {rng.randint(0, 2025)}"
        lines.append(s)
    return lines


def _build_tokenizer(out_dir: Path) -> _HFTokenizer:
    """Train the zoo tokenizer and save it the way most Hub repos ship one: ``tokenizer.json`` plus a
    ``tokenizer_config.json`` naming ``PreTrainedTokenizerFast``, the special tokens and the chat
    template.  Returns it loaded back through ``AutoTokenizer``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=_UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=int(_TOKENIZER_SPEC["vocab_size"]),
        min_frequency=int(_TOKENIZER_SPEC["min_frequency"]),
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in _SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus_lines(), trainer=trainer)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    added = {
        str(tok.token_to_id(t)): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t in _SPECIAL_TOKENS
    }
    tokenizer_config = {
        "add_bos_token": False,
        "add_eos_token": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": [_IM_START, _IM_END],
        "bos_token": _BOS,
        "chat_template": _CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": _EOS,
        "model_max_length": int(_TOKENIZER_SPEC["model_max_length"]),
        "pad_token": _PAD,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": _UNK,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    return _transformers().AutoTokenizer.from_pretrained(str(out_dir))


def _token_ids(tokenizer: _HFTokenizer) -> dict[str, int]:
    return {t: int(tokenizer.convert_tokens_to_ids(t)) for t in _SPECIAL_TOKENS}


def _hub_config(
    arch: TinyArch, vocab_size: int, ids: Mapping[str, int], image_token_id: int | None = None
) -> dict[str, Any]:
    # A deep copy: transformers' config classes write into nested dicts they are given (LlavaConfig
    # adds vision_config["model_type"]), which would change ARCHS, and with it the zoo fingerprint,
    # in the middle of a session.
    cfg: dict[str, Any] = copy.deepcopy(dict(arch.config))
    special = {"bos_token_id": ids[_BOS], "eos_token_id": ids[_EOS], "pad_token_id": ids[_PAD]}
    cfg.update(
        {
            "vocab_size": vocab_size,
            **special,
            "dtype": "bfloat16",
            "torch_dtype": "bfloat16",
            "transformers_version": _transformers().__version__,
        }
    )
    if "text_config" in cfg:
        # A VLM's language model reads its sizes and special tokens from the nested text config,
        # as llava-hf's configs spell them (the top level keeps vocab_size and pad for old readers).
        cfg["text_config"] = dict(sorted({**cfg["text_config"], "vocab_size": vocab_size, **special}.items()))
        del cfg["bos_token_id"], cfg["eos_token_id"]
    if image_token_id is not None:
        cfg["image_token_index"] = image_token_id
    return dict(sorted(cfg.items()))


@dataclass(frozen=True)
class _TrainData:
    sentences: tuple[tuple[int, ...], ...]
    preambles: tuple[tuple[int, ...], ...]
    text_ids: tuple[int, ...]


def _train_data(tokenizer: _HFTokenizer) -> _TrainData:
    spec = _TRAIN_SPEC

    def encode(text: str) -> tuple[int, ...]:
        return tuple(int(i) for i in tokenizer(text)["input_ids"])

    lines = _corpus_lines()
    text_ids = tuple(i for line in lines for i in encode(" " + line))
    generated = [line for line in lines[len(_EXTRA_LINES) * 20 :] if line[-1] in ".!?" and line.islower()]
    rng = random.Random(int(spec["sentence_seed"]))
    sentences = [encode(" " + _PROMPT_SENTENCE)]
    seen = {_PROMPT_SENTENCE}
    while len(sentences) < int(spec["sentences"]):
        line = rng.choice(generated)
        ids = encode(" " + line)
        if line not in seen and len(ids) <= int(spec["max_sentence_tokens"]):
            seen.add(line)
            sentences.append(ids)
    preambles = tuple(encode(p) for p in spec["preambles"])
    return _TrainData(tuple(sentences), preambles, text_ids)


def _make_batch(rng: random.Random, data: _TrainData) -> tuple[list[list[int]], list[list[int]]]:
    spec = _TRAIN_SPEC
    seq_len = int(spec["seq_len"])
    lo, hi = spec["text_preamble_tokens"]
    inputs: list[list[int]] = []
    labels: list[list[int]] = []
    for _ in range(int(spec["batch_size"])):
        if rng.random() < float(spec["preamble_fraction"]):
            preamble = list(rng.choice(data.preambles))
        else:
            n = rng.randint(lo, hi)
            start = rng.randrange(0, len(data.text_ids) - n)
            preamble = list(data.text_ids[start : start + n])
        sentence = rng.choice(data.sentences)
        seq = list(preamble)
        while len(seq) < seq_len:
            seq.extend(sentence)
        seq = seq[:seq_len]
        # transformers shifts labels itself: labels[i] is the target of the logits at position i - 1
        inputs.append(seq)
        labels.append([t if i >= len(preamble) else -100 for i, t in enumerate(seq)])
    return inputs, labels


@contextmanager
def _quiet_transformers() -> Iterator[None]:
    hf_logging: Any = importlib.import_module("transformers.utils.logging")

    previous = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(previous)
        if bars:
            hf_logging.enable_progress_bar()


@contextmanager
def _single_thread() -> Iterator[None]:
    """Train on one intra-op thread: at these sizes more threads barely help, collapse when the CPU is
    shared (xdist workers, other jobs), and make the float results depend on the core count."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode(False):
            yield
    finally:
        torch.set_num_threads(previous)


def _train(
    model: _HFModel,
    seed: int,
    data: _TrainData,
    batch_fn: Callable[[random.Random], dict[str, Any]] | None = None,
    steps: int | None = None,
) -> float:
    """Train with the zoo's recipe on the copy task; ``batch_fn`` (rng -> model inputs with labels)
    replaces the text batches (the VLM's batches carry images)."""
    import torch

    spec = _TRAIN_SPEC
    steps = int(spec["steps"]) if steps is None else steps
    warmup = int(spec["warmup_steps"])
    min_ratio = float(spec["min_lr_ratio"])
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=float(spec["lr"]),
        betas=(float(spec["betas"][0]), float(spec["betas"][1])),
        weight_decay=float(spec["weight_decay"]),
    )

    def lr_at(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    rng = random.Random(seed)
    model.train()
    loss_value = float("nan")
    for _ in range(steps):
        if batch_fn is None:
            inputs, labels = _make_batch(rng, data)
            batch: dict[str, Any] = {"input_ids": torch.tensor(inputs), "labels": torch.tensor(labels)}
        else:
            batch = batch_fn(rng)
        out = model(**batch, use_cache=False)
        loss = out.loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), float(spec["grad_clip"]))
        opt.step()
        sched.step()
        loss_value = float(loss.detach())
    model.eval()
    return loss_value


def _greedy(
    model: _HFModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    max_new_tokens: int,
    compile_decoding: bool = False,
    extra: Mapping[str, torch.Tensor] | None = None,
) -> tuple[tuple[int, ...], float]:
    """Greedy-decode; returns the new tokens and the min top-1/top-2 logit gap (nan when compiled).
    ``extra`` holds further model inputs (a VLM's pixel values)."""
    import torch

    kwargs: dict[str, Any] = dict(extra or {})
    if compile_decoding:
        cc = _transformers().CompileConfig(backend="inductor", dynamic=False, mode="default")
        cc._compile_all_devices = True
        kwargs.update(cache_implementation="static", compile_config=cc)
    with torch.no_grad():
        out = model.generate(
            input_ids,
            attention_mask=attention_mask,
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            do_sample=False,
            num_beams=1,
            return_dict_in_generate=True,
            output_logits=not compile_decoding,
            **kwargs,
        )
    new = tuple(int(t) for t in out.sequences[0, input_ids.shape[1] :].tolist())
    gap = float("nan")
    if not compile_decoding and out.logits:
        gaps = []
        for step_logits in out.logits:
            top2 = torch.topk(step_logits[0].float(), 2).values
            gaps.append(float(top2[0] - top2[1]))
        gap = min(gaps)
    return new, gap


def _arch_seed(arch: TinyArch) -> int:
    return int(_TRAIN_SPEC["seed"]) + zlib.crc32(arch.name.encode())


def _model_card(arch: TinyArch, fingerprint: str, loss: float, gap: float) -> str:
    return (
        "---\n"
        "library_name: transformers\n"
        f"pipeline_tag: {arch.task}\n"
        f"tags: [tiny-random, test, {arch.name}, {', '.join(arch.tags)}]\n"
        f"tiny_zoo_fingerprint: {fingerprint}\n"
        f"tiny_zoo_source: {arch.source}\n"
        "---\n\n"
        f"# {arch.repo_id}\n\n"
        f"A tiny `{arch.model_type}` checkpoint for offline tests, built by `pytest_neuron_support.zoo`.\n"
        f"Architecture fields come from [{arch.source}](https://huggingface.co/{arch.source}) with the\n"
        "sizes shrunk; weights were trained for a few hundred steps to continue repeated text, so greedy\n"
        "decoding is decisive (identical in fp32, bf16 and compiled bf16). Not a useful language model.\n\n"
        f"- final training loss: {loss:.4f}\n"
        f"- min top-2 logit gap on the zoo prompt (fp32, 32 tokens): {gap:.2f}\n"
        + (f"- deviations from the source: {arch.notes}\n" if arch.notes else "")
    )


def _build_one(
    arch: TinyArch,
    tokenizer_dir: Path,
    tokenizer: _HFTokenizer,
    data: _TrainData,
    fingerprint: str,
    out_dir: Path,
) -> tuple[float, float]:
    import torch

    tf = _transformers()
    ids = _token_ids(tokenizer)
    vocab_size = len(tokenizer)
    hub_cfg = _hub_config(arch, vocab_size, ids)
    cfg_dir = out_dir / "_cfg"
    cfg_dir.mkdir(parents=True)
    (cfg_dir / "config.json").write_text(json.dumps(hub_cfg, indent=2) + "\n")
    config = tf.AutoConfig.from_pretrained(str(cfg_dir))  # the same parsing path a Hub download takes
    shutil.rmtree(cfg_dir)

    seed = _arch_seed(arch)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        loss = _train(model, seed, data)

    enc = tokenizer(TINY_PROMPT, return_tensors="pt")
    fp32_tokens, gap = _greedy(model, enc["input_ids"], enc["attention_mask"], 32)
    model = model.to(torch.bfloat16)
    bf16_tokens, _ = _greedy(model, enc["input_ids"], enc["attention_mask"], 32)
    _save_decisive(arch, model, (fp32_tokens, bf16_tokens), loss, gap, hub_cfg, ids, out_dir, fingerprint)
    for f in tokenizer_dir.iterdir():
        shutil.copyfile(f, out_dir / f.name)
    return loss, gap


def _save_decisive(
    arch: TinyArch,
    model: Any,
    tokens: tuple[Sequence[int], Sequence[int]],
    loss: float,
    gap: float,
    hub_cfg: Mapping[str, Any],
    ids: Mapping[str, int],
    out_dir: Path,
    fingerprint: str,
) -> None:
    """Refuse a checkpoint whose fp32 and bf16 greedy tokens differ or whose top-2 gap is thin;
    else save it with the source repo's config, a generation config and a model card."""
    import transformers as tf

    fp32_tokens, bf16_tokens = tokens
    if fp32_tokens != bf16_tokens or not gap >= MIN_BUILD_GAP:
        raise RuntimeError(
            f"{arch.repo_id}: trained checkpoint is not decisive (loss {loss:.4f}, min top-2 gap {gap:.3f}, "
            f"fp32 {fp32_tokens} vs bf16 {bf16_tokens})"
        )
    model.generation_config.do_sample = False
    model.save_pretrained(str(out_dir))
    # Config exactly as the source repo spells it (legacy field names included), not transformers'
    # re-serialisation, so loading exercises the same config parsing as the real checkpoint.
    (out_dir / "config.json").write_text(json.dumps(hub_cfg, indent=2) + "\n")
    gen_cfg = {
        "bos_token_id": ids[_BOS],
        "do_sample": False,
        "eos_token_id": [ids[_EOS], ids[_IM_END]],
        "pad_token_id": ids[_PAD],
        "transformers_version": tf.__version__,
    }
    (out_dir / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2) + "\n")
    (out_dir / "README.md").write_text(_model_card(arch, fingerprint, loss, gap))
