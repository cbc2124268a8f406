"""run.py's run for a forward task's pipeline check: the task's fixed inputs through the pipeline's own call
(its preprocessing, its forward, its postprocessing), twice, as a user calls it, with the model compiled
with the device's backend (``pipe.model = torch.compile(pipe.model, backend=<device's>)``, what a user does
to compile a pipeline's model).

The pipeline runs one input at a time (its default batch size), each padded to the direct path's length
(``padding="max_length"``: one static shape, so one graph for every sentence). What the model returned on
each call is read by watching the model (:class:`ForwardWatch`, a forward hook on the compiled module, run
outside the compiled graph): its scores, read into items exactly as the direct path reads them, so the
device's items are checked against the direct path's CPU reference by the same rule. The pipeline's own
answers (its labels, its tags, its words) are kept beside them.

A model the pipeline did not put on the asked device (pipeline.py's placement) is not run: the result says
where it is, and the check FAILs it.

Spliced into run.py last, after the input kind's fragment and forward.py, whose ``run_task`` and
``COMPILED_CALL`` the ones here replace.
"""

from __future__ import annotations

from run import (
    SPEC,
    cold_then_warm,
    decided,
    fixed_audio,
    fixed_image,
    forward_texts,
    outputs_read,
    pil_image,
    placement,
    read_items,
    repeats,
)

# isort: split
# @@TASK@@
#: What compiles (the message of a run that compiled nothing names it).
COMPILED_CALL = "the pipeline's forward pass"  # replaces forward.py's


class ForwardWatch:
    """A forward hook on the pipeline's model: keeps each call's inputs and its scores, copied to the host at
    once (a backend that reuses its output buffers must not let a later call overwrite an earlier one's)."""

    def __init__(self, module):
        self.calls = []
        self.handle = module.register_forward_hook(self, with_kwargs=True)

    def __call__(self, module, args, kwargs, output):
        outputs = [getattr(output, name).detach().to("cpu", copy=True) for name in outputs_read()]
        self.calls.append(({key: value for key, value in kwargs.items() if hasattr(value, "to")}, outputs))


def pipeline_inputs(torch, pipe):
    """(what the pipeline is called with, its call's keywords): the direct path's inputs, as a user hands them."""
    options = SPEC["task_options"]
    kind = options["input"]
    if kind == "text":
        texts = forward_texts(pipe.tokenizer)
        keywords = {"padding": "max_length", "truncation": True, "max_length": options["length"]}
        if options.get("candidate_labels"):
            # Every sentence against every label: the pipeline runs the model once per (sentence, hypothesis)
            # pair, each at its own length (its tokenizer call takes no padding argument).
            labels = list(options["candidate_labels"])
            return texts, {"candidate_labels": labels, "hypothesis_template": options["hypothesis_template"]}
        if SPEC["task"] == "token-classification":
            # Its pipeline takes no padding argument: each sentence runs at its own length, so each length
            # compiles a graph of its own (the row's graphs_compiled says how many), as a user's pipeline would.
            return texts, {"ignore_labels": []}
        if SPEC["task"] == "fill-mask":
            return texts, {"top_k": 1, "tokenizer_kwargs": keywords}
        return texts, keywords
    # An image or a waveform with the task row's keywords (a classifier's top label; a zero-shot image
    # classifier's candidate labels and hypothesis).
    keywords = dict(options.get("pipeline_keywords", {}))
    if options.get("candidate_labels"):
        keywords |= {"candidate_labels": list(options["candidate_labels"])}
        keywords |= {"hypothesis_template": options["hypothesis_template"]}
    if kind == "image":
        card = fixed_image(torch, *SPEC["image_size"])
        return [pil_image(c) for c in (card, card.flip(-1))], keywords
    wave = fixed_audio(torch)
    rate = options["audio"]["sample_rate"]
    return [{"raw": w.numpy(), "sampling_rate": rate} for w in (wave, wave.flip(0))], keywords


def read_calls(torch, calls, texts, tokenizer, model):
    """Every call's items, in input order, as the direct path reads one batch (the input's index restored), and
    the outputs checked as numbers only, read into the same items."""
    vectors, items, decisions, labels, also = [], [], [], [], {}
    for index, (inputs, outputs) in enumerate(calls):
        batch = {key: value.to("cpu") for key, value in inputs.items()}
        special = None
        if SPEC["task_options"]["read"] == "tokens":
            # The tokenizer's own special-tokens mask, as the direct path reads it (an [UNK] or a <mask> is a
            # word-piece, not a special token): the sentence tokenized again as the pipeline tokenized it.
            special = tokenizer(texts[index], return_special_tokens_mask=True, return_tensors="pt")
            special = special["special_tokens_mask"]
            if special.shape != batch["input_ids"].shape:
                raise RuntimeError(f"sentence {index}: the pipeline's tokens are not its tokenizer's own")
        v, found, d, names, more = read_items(torch, batch, special, outputs, model, tokenizer)
        for name, vectors_of in more.items():
            also.setdefault(name, []).extend(vectors_of)
        vectors += v
        items += [[index, *position[1:]] for position in found]
        decisions += d
        labels += names
    return vectors, items, decisions, labels, also


def pipeline_answers(said):
    """What the pipeline itself answered, one line per input (its top label, its tags, its word, a zero-shot
    classifier's best label, every detection's or segment's label, a transcription; a depth map's or the
    features' size)."""
    lines = []
    for answer in said:
        if isinstance(answer, dict) and "labels" in answer:
            lines.append(str(answer["labels"][0]))  # a zero-shot classifier's best candidate label
            continue
        if isinstance(answer, dict) and "text" in answer:
            lines.append(repr(answer["text"]))  # a CTC recogniser's transcription, quoted: it may be blank
            continue
        if isinstance(answer, dict) and "predicted_depth" in answer:
            lines.append(f"depth {list(answer['predicted_depth'].shape)}")
            continue
        if isinstance(answer, list) and answer and isinstance(answer[0], list):
            lines.append(f"features {len(answer)}x{len(answer[0])}x{len(answer[0][0])}")
            continue
        if isinstance(answer, list) and answer and isinstance(answer[0], dict) and {"box", "mask"} & set(answer[0]):
            lines.append(", ".join(str(found["label"]) for found in answer))  # every detection, every segment
            continue
        first = answer[0] if isinstance(answer, list) and answer and isinstance(answer[0], dict) else answer
        if isinstance(answer, list) and answer and "entity" in answer[0]:
            lines.append(" ".join(str(entity["entity"]) for entity in answer))
        elif isinstance(first, dict):
            lines.append(str(first.get("label", first.get("token_str", first))))
        else:
            lines.append(str(first))
    return "; ".join(lines)[:1000]


def run_task(torch, pipe, model, state):  # replaces forward.py's
    # Read now, after the session's post-load hook ran: where the model is when it runs.
    placed = placement(pipe)
    if placed["model_devices"] != [SPEC["device"]["device_map"].split(":")[0]]:
        return {"tokens": [], "ran": False, **placed}  # not on the device: the check FAILs it at load
    tokenizer = getattr(pipe, "tokenizer", None)
    inputs, keywords = pipeline_inputs(torch, pipe)
    if SPEC["compile"]:
        pipe.model = torch.compile(pipe.model, backend=SPEC["compile_backend"], dynamic=False, mode="default")
    watch = ForwardWatch(pipe.model)
    runs = []

    def call():
        start = len(watch.calls)
        # A fresh dict per call: the speech recognition pipeline pops a waveform dict's "raw" and "sampling_rate".
        given = [dict(one) if isinstance(one, dict) else one for one in inputs]
        with torch.no_grad():
            said = pipe(given, **keywords)
        runs.append(watch.calls[start:])
        return said

    said, _, facts = cold_then_warm(torch, call, call)
    watch.handle.remove()
    # Once per input; a zero-shot pipeline once per (input, candidate label) pair.
    text = SPEC["task_options"]["input"] == "text"
    calls = len(inputs) * (len(keywords.get("candidate_labels") or [None]) if text else 1)
    if len(runs[0]) != calls or len(runs[1]) != calls:
        raise RuntimeError(
            f"the pipeline ran the model {len(runs[0])} and {len(runs[1])} times for {len(inputs)} inputs, "
            f"not {calls} times"
        )
    texts = inputs if text else None
    vectors, items, decisions, labels, also = read_calls(torch, runs[0], texts, tokenizer, model)
    again, _, _, _, also_again = read_calls(torch, runs[1], texts, tokenizer, model)
    return {
        "ran": True,
        "outputs": vectors,
        "also_outputs": also,
        "items": items,
        "decisions": decisions,
        "decision_labels": labels,
        "tokens": [],
        "text": decided(labels) if labels else pipeline_answers(said),
        "pipeline_text": pipeline_answers(said),
        "repeat_identical": repeats(vectors, also, again, also_again),
        **facts,
        **placed,
    }
