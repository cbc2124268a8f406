"""The forward tasks' models (text, token, image and audio classification, fill-mask): one per task, each a
real Hub checkpoint's config with the sizes shrunk (spec.py's ``_FORWARD_SPECS``) with its preprocessor (the
zoo's tokenizer with a mask token and RoBERTa's ``<s> ... </s>`` framing, or the checkpoint family's image
processor or feature extractor), trained for a few seconds on run.py's own inputs (built by the template's
own ``forward_batch``, so exactly what run.py feeds) until every decision is
decisive by the verdict's own rule (``verdict.decisions``): each item's float32 margin larger than the
rule's multiple of what bf16 rounding moves its scores. Random initialisation leaves those margins far
below bf16's noise, where a planted fault could hide in a near-tie.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

from pytest_neuron_support.zoo.spec import _FORWARD_SPECS, _FORWARD_TRAIN


def _forward_tokenizer(tokenizer_dir: Path, out_dir: Path) -> Any:
    """The zoo tokenizer with ``<mask>`` and ``<s> ... </s>`` framing, saved into ``out_dir``, loaded back."""
    from tokenizers import AddedToken, Tokenizer, processors

    transformers: Any = importlib.import_module("transformers")
    mask = str(_FORWARD_TRAIN["mask_token"])
    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(mask, special=True, normalized=False, lstrip=True)])
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    assert bos is not None and eos is not None, "the zoo tokenizer has <s> and </s>"
    tok.post_processor = processors.RobertaProcessing(("</s>", eos), ("<s>", bos), trim_offsets=False)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    config.pop("chat_template", None)
    config.pop("added_tokens_decoder", None)
    # An encoder's tokenizer as the Hub ships one: its special tokens, and only the inputs the model takes
    # (DistilBERT's forward has no token_type_ids).
    config.update(
        {
            "mask_token": mask,
            "cls_token": "<s>",
            "sep_token": "</s>",
            "model_input_names": ["input_ids", "attention_mask"],
        }
    )
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return transformers.AutoTokenizer.from_pretrained(str(out_dir))


def _run_batch(torch: Any, task: Any, preprocessor: Any) -> tuple[Any, Any]:
    """What run.py feeds the task's model (its ``forward_batch``), computed by the template's own code, so the
    zoo trains and checks on exactly the inputs every run feeds: (the batch, its special-tokens mask or None)."""
    from pytest_neuron_support.run.runscript import TEST_CARD_SIZE, template, with_spec

    spec = {"sentences": list(task.reading.sentences), "image_size": list(TEST_CARD_SIZE)}
    source = with_spec(template("run.py", task.fragments), {**spec, "task_options": task.task_options()})
    namespace: dict[str, Any] = {"__name__": "neuron_support_run_template"}
    exec(compile(source, "run.py", "exec"), namespace)
    batch: tuple[Any, Any] = namespace["forward_batch"](torch, preprocessor)
    return batch


def _targets(torch: Any, spec: dict[str, Any], preprocessor: Any, batch: Any, special: Any, logits: Any) -> Any:
    """The training labels, one per item run.py reads: -100 wherever nothing is decided (the loss's ignore
    index). An input's label, a word-piece's tag (its token id modulo the label count), the word at a mask, a
    detection query's class (its index modulo the label count: a detector's queries are learned, so each can
    learn its own), or every pixel of an input labelled with the input's label."""
    items, n_labels = spec["read"], int(spec["n_labels"])
    if items in ("sequence", "pixels"):
        labels = torch.tensor(list(spec["labels"]))
        assert len(labels) == logits.shape[0], "one label per input run.py feeds"
        return labels if items == "sequence" else labels.view(-1, 1, 1).expand(-1, *logits.shape[2:]).clone()
    if items == "positions":
        return (torch.arange(logits.shape[1]) % n_labels).expand(logits.shape[0], -1).clone()
    ids = batch["input_ids"]
    if items == "tokens":
        keep = (batch["attention_mask"] == 1) & (special == 0)
        return torch.where(keep, ids % n_labels, torch.full_like(ids, -100))
    words = [preprocessor(w, add_special_tokens=False).input_ids[0] for w in spec["words"]]
    at_mask = ids == preprocessor.mask_token_id
    assert int(at_mask.sum()) == len(words), "one word per mask of tasks/forward.py's MASKED_SENTENCES"
    labels = torch.full_like(ids, -100)
    labels[at_mask] = torch.tensor(words)
    return labels


def _scores_last(items: str, logits: Any) -> Any:
    """The scores on the last axis (a segmentation's class axis is its second)."""
    return logits.permute(0, 2, 3, 1) if items == "pixels" else logits


def _loss(torch: Any, items: str, logits: Any, labels: Any) -> Any:
    """Cross-entropy over the decided items (every task's own head loss, computed one way for all of them)."""
    scores = _scores_last(items, logits)
    return torch.nn.functional.cross_entropy(
        scores.reshape(-1, scores.shape[-1]).float(), labels.reshape(-1), ignore_index=-100
    )


def _items(torch: Any, items: str, logits: Any, labels: Any) -> list[list[float]]:
    """Each decided item's scores (as run.py reads them: an input's, a token's, a mask's, a query's, a pixel's)."""
    if items == "sequence":
        return [row.tolist() for row in logits.float()]
    scores = _scores_last(items, logits).float()
    return [scores[tuple(at)].tolist() for at in (labels != -100).nonzero().tolist()]


def _vocab_tokenizer(vocab: dict[str, Any], out_dir: Path) -> Any:
    """A tokenizer over the row's vocabulary (``vocab``: its class, its tokens in id order, its special tokens),
    as a CTC checkpoint ships one: ``vocab.json`` beside its ``tokenizer_config.json``."""
    transformers: Any = importlib.import_module("transformers")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "vocab.json"
    path.write_text(json.dumps({t: i for i, t in enumerate(vocab["tokens"])}) + "\n", encoding="utf-8")
    return getattr(transformers, vocab["class"])(str(path), **vocab["special"])


def _preprocessor(spec: dict[str, Any], loader: str, tokenizer_dir: Path, out_dir: Path) -> Any:
    """The checkpoint's preprocessor, saved into ``out_dir`` as a Hub repo ships it, loaded back with run.py's
    class (``loader``)."""
    transformers: Any = importlib.import_module("transformers")
    if "preprocessor" not in spec:
        return _forward_tokenizer(tokenizer_dir, out_dir)
    fields = dict(spec["preprocessor"])
    made = getattr(transformers, fields.pop("class"))(**fields)
    processor = spec.get("processor")
    if processor:
        # An image processor or a feature extractor and a tokenizer in one processor (a CLIP-style model takes
        # both; a CTC recogniser's pipeline decodes its frames with the tokenizer): the row's own vocabulary
        # where it has one (a CTC head's characters), else the zoo's tokenizer.
        tokenizer = _vocab_tokenizer(spec["vocab"], out_dir) if "vocab" in spec else None
        kind = "feature_extractor" if isinstance(made, transformers.SequenceFeatureExtractor) else "image_processor"
        made = getattr(transformers, processor)(
            **{kind: made}, tokenizer=tokenizer or _forward_tokenizer(tokenizer_dir, out_dir)
        )
    made.save_pretrained(out_dir)
    return getattr(transformers, loader).from_pretrained(str(out_dir))


def _build_forward(name: str, tokenizer_dir: Path, fingerprint: str, out_dir: Path) -> str:
    """Build, train and save forward model ``name`` into ``out_dir``; returns its log line's figures. Raises
    when a decision is not decisive (the verdict's own rule) or not the one it was trained to make."""
    import torch

    from pytest_neuron_support.tasks.table import task_of
    from pytest_neuron_support.verdict.decisions import noise_of, top_two
    from pytest_neuron_support.verdict.tolerance import MULTIPLE

    transformers: Any = importlib.import_module("transformers")
    task: Any = task_of(_FORWARD_SPECS[name]["task"])
    spec = {**_FORWARD_SPECS[name], "read": task.reading.items, "fingerprint": fingerprint}
    spec["pipeline_tag"] = task.pipeline_tag
    torch.manual_seed(int(_FORWARD_TRAIN["seed"]))
    preprocessor = _preprocessor(spec, task.reading.preprocessor or "AutoTokenizer", tokenizer_dir, out_dir)
    config_fields = dict(spec["config"])
    special_ids: dict[str, Any] = {}
    tokenizer = getattr(preprocessor, "pad_token_id", None) is not None
    if tokenizer:
        special_ids["pad_token_id"] = preprocessor.pad_token_id
        config_fields["vocab_size"] = len(preprocessor)
    text = getattr(preprocessor, "tokenizer", None)
    if text is not None and "text_config" in config_fields:
        # A text tower's ids are its tokenizer's (CLIP pools at the end-of-text token's position).
        ids = {"vocab_size": len(text), "pad_token_id": text.pad_token_id}
        ids |= {"bos_token_id": text.bos_token_id, "eos_token_id": text.eos_token_id}
        config_fields["text_config"] = {**config_fields["text_config"], **ids}
    if config_fields["model_type"] == "roberta":
        special_ids |= {"bos_token_id": preprocessor.bos_token_id, "eos_token_id": preprocessor.eos_token_id}
    config = transformers.AutoConfig.for_model(**config_fields, **special_ids)
    model = getattr(transformers, spec["auto_class"])(config)
    with torch.no_grad():
        # Parameters the architecture starts at zero (YOLOS's detection tokens), as a trained checkpoint's are not:
        # all alike, no training could tell its queries apart.
        for parameter in spec.get("init_normal", ()):
            model.get_parameter(parameter).normal_(0.0, float(config.initializer_range))
    batch, special = _run_batch(torch, task, preprocessor)
    read, output = spec["read"], task.reading.output
    if not task.reading.decides:
        # Numbers only (features, a depth map): nothing is decided, so the random weights are checked as they are.
        model.eval()
        model.save_pretrained(out_dir)
        _model_card(out_dir, spec, config_fields, "its numbers are checked as they are, nothing is decided")
        return "untrained: numbers only"
    with torch.no_grad():
        labels = _targets(
            torch,
            {**spec, "n_labels": config.num_labels},
            preprocessor,
            batch,
            special,
            getattr(model(**batch), output),
        )
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(_FORWARD_TRAIN["learning_rate"]))
    model.train()
    loss = float("nan")
    for _ in range(int(_FORWARD_TRAIN["steps"])):
        out = _loss(torch, read, getattr(model(**batch), output), labels)
        optimizer.zero_grad()
        out.backward()
        optimizer.step()
        loss = float(out.detach())
    model.eval()
    model.to(torch.bfloat16).to(torch.float32)  # the weights as saved (bf16), read back as the reference reads them
    with torch.no_grad():
        exact = _items(torch, read, getattr(model(**batch), output), labels)
        model.to(torch.bfloat16)
        rounded_batch = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in batch.items()}
        rounded = _items(torch, read, getattr(model(**rounded_batch), output), labels)
    wanted = labels.tolist() if read == "sequence" else labels[labels != -100].tolist()
    least = float("inf")
    for i, (f, r) in enumerate(zip(exact, rounded, strict=True)):
        top, lead = top_two(f)
        least = min(least, lead / (MULTIPLE * noise_of(f, r)))
        if top != wanted[i] or lead <= MULTIPLE * noise_of(f, r):
            raise RuntimeError(
                f"tiny {name} is not decisive at item {i}: top-1 {top} (trained: {wanted[i]}), margin {lead:.4g}, "
                f"{MULTIPLE:g}x bf16 noise {MULTIPLE * noise_of(f, r):.4g} (loss {loss:.4f})"
            )
    model.save_pretrained(out_dir)
    _model_card(
        out_dir,
        spec,
        config_fields,
        f"trained on run.py's own inputs until every decision is decisive (loss {loss:.4f})",
    )
    return f"loss {loss:.4f}, {len(exact)} decisions, least margin {least:.1f}x the decisive bound"


def _model_card(out_dir: Path, spec: dict[str, Any], config_fields: dict[str, Any], how: str) -> None:
    fingerprint = spec["fingerprint"]
    (out_dir / "README.md").write_text(
        f"---\nlibrary_name: transformers\npipeline_tag: {spec['pipeline_tag']}\n---\n"
        f"# A tiny {config_fields['model_type']} for {spec['task']}\n\nBuilt offline by pytest-neuron-support's "
        f"tiny zoo from {spec['source']}'s config with the sizes shrunk, {how}.\n\n"
        f"tiny_zoo_fingerprint: {fingerprint}\n",
        encoding="utf-8",
    )
