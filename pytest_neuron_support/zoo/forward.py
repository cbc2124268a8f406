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


def _targets(torch: Any, spec: dict[str, Any], preprocessor: Any, batch: Any, special: Any, n_labels: int) -> Any:
    """The training labels: -100 wherever nothing is decided (the loss's ignore index)."""
    items = spec["read"]
    if items == "sequence":
        labels = list(spec["labels"])
        assert len(labels) == len(next(iter(batch.values()))), "one label per input run.py feeds"
        return torch.tensor(labels)
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


def _items(torch: Any, items: str, logits: Any, labels: Any) -> list[list[float]]:
    """Each decided item's scores (as run.py reads them: an input's, a token's, a mask's)."""
    if items == "sequence":
        return [row.tolist() for row in logits.float()]
    return [logits[i, j].float().tolist() for i, j in (labels != -100).nonzero().tolist()]


def _preprocessor(spec: dict[str, Any], loader: str, tokenizer_dir: Path, out_dir: Path) -> Any:
    """The checkpoint's preprocessor, saved into ``out_dir`` as a Hub repo ships it, loaded back with run.py's
    class (``loader``)."""
    transformers: Any = importlib.import_module("transformers")
    if "preprocessor" not in spec:
        return _forward_tokenizer(tokenizer_dir, out_dir)
    fields = dict(spec["preprocessor"])
    getattr(transformers, fields.pop("class"))(**fields).save_pretrained(out_dir)
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
    spec = {**_FORWARD_SPECS[name], "read": task.reading.items}
    torch.manual_seed(int(_FORWARD_TRAIN["seed"]))
    preprocessor = _preprocessor(spec, task.reading.preprocessor or "AutoTokenizer", tokenizer_dir, out_dir)
    config_fields = dict(spec["config"])
    special_ids: dict[str, Any] = {}
    tokenizer = getattr(preprocessor, "pad_token_id", None) is not None
    if tokenizer:
        special_ids["pad_token_id"] = preprocessor.pad_token_id
        config_fields["vocab_size"] = len(preprocessor)
    if config_fields["model_type"] == "roberta":
        special_ids |= {"bos_token_id": preprocessor.bos_token_id, "eos_token_id": preprocessor.eos_token_id}
    config = transformers.AutoConfig.for_model(**config_fields, **special_ids)
    model = getattr(transformers, spec["auto_class"])(config)
    batch, special = _run_batch(torch, task, preprocessor)
    labels = _targets(torch, spec, preprocessor, batch, special, int(config.num_labels))
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(_FORWARD_TRAIN["learning_rate"]))
    model.train()
    loss = float("nan")
    for _ in range(int(_FORWARD_TRAIN["steps"])):
        out = model(**batch, labels=labels)
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
        loss = float(out.loss.detach())
    model.eval()
    model.to(torch.bfloat16).to(torch.float32)  # the weights as saved (bf16), read back as the reference reads them
    with torch.no_grad():
        exact = _items(torch, spec["read"], model(**batch).logits, labels)
        model.to(torch.bfloat16)
        rounded_batch = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in batch.items()}
        rounded = _items(torch, spec["read"], model(**rounded_batch).logits, labels)
    wanted = labels.tolist() if spec["read"] == "sequence" else labels[labels != -100].tolist()
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
    (out_dir / "README.md").write_text(
        f"---\nlibrary_name: transformers\npipeline_tag: {spec['task']}\n---\n"
        f"# A tiny {config_fields['model_type']} for {spec['task']}\n\nBuilt offline by pytest-neuron-support's "
        f"tiny zoo from {spec['source']}'s config with the sizes shrunk, trained on run.py's own inputs until "
        f"every decision is decisive (loss {loss:.4f}).\n\ntiny_zoo_fingerprint: {fingerprint}\n",
        encoding="utf-8",
    )
    return f"loss {loss:.4f}, {len(exact)} decisions, least margin {least:.1f}x the decisive bound"
