"""run.py's forward tasks (text, token, image and audio classification, fill-mask, image features, depth,
object detection, segmentation): the
model and its preprocessor (the input fragment spliced before this one says which: text.py's tokenizer,
vision.py's or audio.py's processor), fixed inputs in one static shape, one forward pass compiled with
torch.compile (device runs) and run twice (the second must repeat the first), and each item's scores
written: the items SPEC["task_options"]["read"] names (``sequence``: one per input; ``tokens``: one per
word-piece, special tokens left out; ``mask``: one per mask token; ``positions``: one per detection query;
``pixels``: one per pixel of a segmentation), each the output's vector there (its logits, or the input's
features or depth map), in float32 on the host; the outputs checked as numbers only (``also``: a detector's
boxes) are read into the same items.

The inputs (SPEC["task_options"]["input"]): ``text``, a fixed list of sentences (SPEC["sentences"]; a
fill-mask task's hold ``{mask}``, written as the tokenizer's own mask token) padded to one length
(SPEC["task_options"]["length"]); ``image``, run.py's test card and its mirror image through the image
processor; ``audio``, run.py's waveform and the same samples reversed through the feature extractor.

Each item's decision (the top-1 of its vector; none where the output is numbers only) is written too, named
as the checkpoint names it (its ``id2label``, or the token a fill-mask model puts at the mask). The CPU
reference (float32) runs the same forward again in the device's dtype: the dtype's own noise, which the
calibrated tolerance rule judges the device's distance (and the decisions' margins) against.

Spliced into run.py in place of its @@TASK@@ import; see text.py.
"""

from __future__ import annotations

from run import PREPROCESSOR, SPEC, cold_then_warm, fixed_audio, fixed_image, locate_modules, placed

# isort: split
# @@TASK@@
#: The class run.py loads the preprocessor with: the task row's (an audio classifier's feature extractor, where
#: the speech fragment's AutoProcessor would also ask for a tokenizer it has none of), else its input
#: fragment's.
PREPROCESSOR = SPEC["task_options"].get("preprocessor") or PREPROCESSOR
#: What compiles (the message of a run that compiled nothing names it).
COMPILED_CALL = "the forward pass"
#: Where a fill-mask sentence puts the tokenizer's mask token.
MASK_PLACEHOLDER = "{mask}"


def forward_texts(tokenizer):
    """SPEC's sentences, a fill-mask task's with the tokenizer's own mask token in place."""
    sentences = list(SPEC["sentences"])
    if SPEC["task_options"]["read"] != "mask":
        return sentences
    if getattr(tokenizer, "mask_token", None) is None:
        raise ValueError("the tokenizer has no mask token: a fill-mask model's tokenizer must declare one")
    return [s.replace(MASK_PLACEHOLDER, tokenizer.mask_token) for s in sentences]


def hypotheses():
    """Each candidate label written into the hypothesis template (a zero-shot task's)."""
    options = SPEC["task_options"]
    return [options["hypothesis_template"].format(label) for label in options["candidate_labels"]]


def zero_shot_pairs(texts):
    """(sentence, hypothesis) for every sentence and every candidate label, sentence by sentence."""
    return [(t, hypothesis) for t in texts for hypothesis in hypotheses()]


def forward_batch(torch, preprocessor):
    """(the model's inputs on CPU, which of them are the tokenizer's special tokens or None): SPEC's inputs."""
    options = SPEC["task_options"]
    kind = options["input"]
    if kind == "text":
        texts, truncation = [forward_texts(preprocessor)], True
        if options.get("candidate_labels"):
            # A zero-shot classifier's items: each sentence paired with each label's hypothesis, as its pipeline
            # pairs them (only the sentence cut, never the hypothesis).
            pairs = zero_shot_pairs(texts[0])
            texts, truncation = [[p for p, _ in pairs], [h for _, h in pairs]], "only_first"
        batch = preprocessor(
            *texts,
            padding="max_length",
            truncation=truncation,
            max_length=options["length"],
            return_special_tokens_mask=True,
            return_tensors="pt",
        )
        special = batch.pop("special_tokens_mask")
        full = [i for i, row in enumerate(batch["attention_mask"].tolist()) if sum(row) >= options["length"]]
        if full:
            # A sentence that fills every position may have been cut: its items would not be the sentence's.
            raise ValueError(
                f"sentences {full} fill all {options['length']} word-pieces of this tokenizer: they may have been "
                "cut, so their items would not be the whole sentence's"
            )
        return batch, special
    if kind == "image":
        card = fixed_image(torch, *SPEC["image_size"])
        if options.get("candidate_labels"):
            # A zero-shot image classifier: every label's hypothesis beside the images, padded as its pipeline
            # pads them (to the longest: one fixed shape, since the hypotheses are fixed).
            return preprocessor(
                images=[card, card.flip(-1)], text=hypotheses(), padding=True, return_tensors="pt"
            ), None
        return preprocessor(images=[card, card.flip(-1)], return_tensors="pt"), None
    if kind == "audio":
        wave = fixed_audio(torch)
        waves = [wave.numpy(), wave.flip(0).numpy()]
        return preprocessor(waves, sampling_rate=options["audio"]["sample_rate"], return_tensors="pt"), None
    raise NotImplementedError(f"SPEC['task_options']['input'] = {kind!r}: run.py feeds text, image or audio")


def outputs_read():
    """Every output run.py reads: the scores (SPEC["task_options"]["output"]), then the ones checked as numbers
    only (``also``: a detector's boxes)."""
    options = SPEC["task_options"]
    return [options["output"], *options.get("also", [])]


def item_positions(batch, special, scores, tokenizer):
    """Where each item sits in an output: (input, position...) per SPEC["task_options"]["read"]."""
    read = SPEC["task_options"]["read"]
    if read == "sequence":
        return [(i,) for i in range(scores.shape[0])]
    if read == "tokens":
        keep = (batch["attention_mask"].to("cpu") == 1) & (special == 0)
        return [(int(i), int(j)) for i, j in keep.nonzero().tolist()]
    if read == "mask":
        found = (batch["input_ids"].to("cpu") == tokenizer.mask_token_id).nonzero().tolist()
        return [(int(i), int(j)) for i, j in found]
    if read == "positions":
        return [(i, j) for i in range(scores.shape[0]) for j in range(scores.shape[1])]
    if read == "pixels":
        # Every pixel, or every n-th of a map larger than the grid (the same grid on both sides).
        _, _, height, width = scores.shape
        grid = SPEC["task_options"]["pixel_grid"]
        rows, columns = range(0, height, -(-height // grid)), range(0, width, -(-width // grid))
        return [(i, y, x) for i in range(scores.shape[0]) for y in rows for x in columns]
    raise NotImplementedError(
        f"SPEC['task_options']['read'] = {read!r}: run.py reads sequence, tokens, mask, positions or pixels"
    )


def vector_at(scores, at):
    """An item's vector: an input's whole output (flattened), a position's scores, or a pixel's class scores."""
    if len(at) == 1:
        return scores[at[0]].reshape(-1)
    if SPEC["task_options"]["read"] == "pixels":
        return scores[at[0], :, at[1], at[2]]
    return scores[at[0], at[1]].reshape(-1)


def read_items(torch, batch, special, outputs, model, tokenizer):
    """(each item's scores in float32 on the host, its (input, position...), its decision, its decision's name,
    the outputs checked as numbers only read into the same items: {name: vectors}) from every output
    :func:`outputs_read` names; no decisions where the task's output is numbers only."""
    read = SPEC["task_options"]["read"]
    scores = outputs[0].detach().to("cpu").float()  # to the host first: the harness's ops stay off the device
    picks = item_positions(batch, special, scores, tokenizer)
    vectors = [vector_at(scores, at) for at in picks]
    also = {}
    for name, output in zip(outputs_read()[1:], outputs[1:], strict=True):
        more = output.detach().to("cpu").float()
        also[name] = [vector_at(more, at).tolist() for at in item_positions(batch, special, more, tokenizer)]
    if not SPEC["task_options"].get("decides", True):
        return [v.tolist() for v in vectors], [list(p) for p in picks], [], [], also
    id2label = getattr(model.config, "id2label", None) or {}

    candidates = SPEC["task_options"].get("candidate_labels") if SPEC["task_options"]["input"] == "image" else None

    def name(index):
        if candidates:
            return str(candidates[index])  # a zero-shot image classifier's score per candidate label
        return tokenizer.decode([index]).strip() if read == "mask" else str(id2label.get(index, index))

    # The top-1; a one-score head (a reranker) decides by the score's sign, as its pipeline's sigmoid does.
    decisions = [int(v[0] > 0) if v.numel() == 1 else int(v.argmax()) for v in vectors]
    labels = [name(d) for d in decisions]
    return [v.tolist() for v in vectors], [list(p) for p in picks], decisions, labels, also


def run_forward(torch, preprocessor, model):
    options = SPEC["task_options"]
    batch, special = forward_batch(torch, preprocessor)
    device = next(model.parameters()).device
    # Pixel values and audio features in the weights' dtype, as a user passes them; ids and masks as they are.
    inputs = {
        key: value.to(device, model.dtype) if value.is_floating_point() else value.to(device)
        for key, value in batch.items()
    }
    forward = model
    if SPEC["compile"]:
        # One static-shape graph of the whole model, head included, with the device's backend.
        forward = torch.compile(model, backend=SPEC["compile_backend"], dynamic=False, mode="default")

    def outputs():
        with torch.no_grad():
            out = forward(**inputs)
        # Copied to the host at once: a backend that reuses its output buffers must not let the warm call
        # overwrite what the cold one returned (the repeat check would compare a buffer with itself).
        return [getattr(out, name).detach().to("cpu", copy=True) for name in outputs_read()]

    first, second, facts = cold_then_warm(torch, outputs, outputs)
    tokenizer = getattr(preprocessor, "tokenizer", preprocessor)
    vectors, items, decisions, labels, also = read_items(torch, batch, special, first, model, tokenizer)
    again, _, _, _, also_again = read_items(torch, batch, special, second, model, tokenizer)
    noise = {}
    noise_dtype = options.get("noise_dtype")
    if noise_dtype:
        # The CPU reference (in float32) runs again in the device's dtype: the dtype's own noise.
        if noise_dtype != SPEC["dtype"]:
            model.to(getattr(torch, noise_dtype))
            for key, value in inputs.items():
                if value.is_floating_point():
                    inputs[key] = value.to(model.dtype)
            rounded, _, _, _, rounded_also = read_items(torch, batch, special, outputs(), model, tokenizer)
            noise = {"noise_outputs": rounded, "noise_also_outputs": rounded_also}
        else:
            noise = {"noise_outputs": vectors, "noise_also_outputs": also}
        noise["noise_dtype"] = noise_dtype
    return {
        "outputs": vectors,
        "also_outputs": also,
        **noise,
        "items": items,
        "decisions": decisions,
        "decision_labels": labels,
        "tokens": [],
        "text": decided(labels) if labels else summary(first),
        "repeat_identical": repeats(vectors, also, again, also_again),
        "prompt_tokens": int(batch["input_ids"].shape[1]) if "input_ids" in batch else None,
        **facts,
    }


def decided(labels):
    """The decisions in words: each item's, or each label's count where there are many (a segmentation's pixels)."""
    if len(labels) <= 32:
        return "; ".join(labels)[:1000]
    counts = {}
    for label in labels:
        counts[label] = counts.get(label, 0) + 1
    return "; ".join(f"{label} x{n}" for label, n in counts.items())[:1000]


def summary(outputs):
    """A task without a decision says what it returned: each output's name and shape."""
    return "; ".join(f"{name} {list(output.shape)}" for name, output in zip(outputs_read(), outputs, strict=True))


def repeats(vectors, also, again, also_again):
    """Whether the second run gave the first one's items, in every output read."""
    return identical(vectors, again) and all(identical(also[name], also_again[name]) for name in also)


def identical(first, second):
    """Whether two runs' items are the same numbers, NaN where the other has NaN included (a NaN is the
    parity check's to report, not a run that failed to repeat)."""
    import math

    def key(vectors):
        return [["nan" if math.isnan(x) else x for x in v] for v in vectors]

    return key(first) == key(second)


def prepare_task():
    return None


def locate_call(torch, preprocessor, model):
    """The forward the first diverging module is looked for in: the task's own fixed inputs, on the model's
    device, floating ones in the weights' dtype at each call (the CPU side runs float32, then the device's dtype)."""
    batch, _ = forward_batch(torch, preprocessor)

    def call(forward):
        weights = next(forward.parameters())  # the model it runs on: the device's, or a CPU copy
        return forward(**placed(dict(batch), weights.device, weights.dtype))

    return call


def run_task(torch, preprocessor, model, state):
    if SPEC.get("locate"):
        return locate_modules(torch, model, locate_call(torch, preprocessor, model))
    return run_forward(torch, preprocessor, model)
