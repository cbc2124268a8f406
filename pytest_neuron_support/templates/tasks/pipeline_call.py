"""run.py's run for the pipeline check: the task's input through the pipeline's own call (its
preprocessing, its ``generate()``, its postprocessing), twice, as a user calls it.

The generation settings are the direct path's (greedy, ``max_new_tokens``, static cache, the device's
compile config: generation.py's ``generate_kwargs``), handed to the pipeline as generation keywords, with
``num_beams=1`` said outright (a pipeline's own defaults may search otherwise). What
the pipeline's ``generate()`` returned is read by watching that one call (:class:`GenerateWatch`): the call
goes through as the pipeline made it, with the logits asked for too, and the pipeline gets back what it
asked for. The tokens after the prompt (or an encoder-decoder's decoder prompt) are then the run's
tokens, checked exactly as the direct path's are; the pipeline's own output (its text) is kept beside them.

A model the pipeline did not put on the asked device (pipeline.py's placement) is not run: the result says
where it is, and the check FAILs it.

Spliced into run.py last, after the task's inputs fragment (text.py, vision.py, audio.py, each with its
``pipeline_call``) and generation.py, whose ``run_task`` and ``COMPILED_CALL`` the ones here replace.
"""

from __future__ import annotations

from run import SPEC, cold_then_warm, generate_kwargs, pipeline_call, placement, top_logprobs

# isort: split
# @@TASK@@
#: What compiles (the message of a run that compiled nothing names it).
COMPILED_CALL = "the pipeline's generate()"  # replaces generation.py's


class GenerateWatch:
    """Stands in for ``model.generate`` while the pipeline runs: calls it with the pipeline's own
    arguments plus ``return_dict_in_generate`` and ``output_logits`` (greedy tokens do not depend on
    either), keeps the output, and returns what the pipeline asked for (the sequences, or the whole
    output when it asked for a dict)."""

    def __init__(self, model):
        self.generate = model.generate
        self.outputs = []
        model.generate = self

    def __call__(self, *args, **kwargs):
        wanted = kwargs.get("return_dict_in_generate", False)
        output = self.generate(*args, **{**kwargs, "return_dict_in_generate": True, "output_logits": True})
        self.outputs.append(output)
        return output if wanted else output.sequences


def pipeline_text(output):
    """The text the pipeline itself returned (its ``generated_text`` or ``text``)."""
    first = output[0] if isinstance(output, list) else output
    first = first[0] if isinstance(first, list) else first
    text = first.get("generated_text", first.get("text"))
    return text if isinstance(text, str) else str(text)


def run_task(torch, pipe, model, state):  # replaces generation.py's
    # Read now, after the session's post-load hook ran: where the model is when it runs, not only where the
    # pipeline first put it (a hook that moves part of it off the device is the same fault).
    placed = placement(pipe)
    if placed["model_devices"] != [SPEC["device"]["device_map"].split(":")[0]]:
        return {"tokens": [], "ran": False, **placed}  # not on the device: the check FAILs it at load
    tokenizer = getattr(pipe, "tokenizer", None) or pipe.processor.tokenizer
    # The direct path's settings, greedy said outright: a pipeline's own defaults (the speech recognition
    # pipeline's num_beams=5) would otherwise make its tokens another search's, not comparable with the
    # direct path's nor checkable teacher-forced. The watch adds the other two itself.
    kwargs = {
        k: v for k, v in generate_kwargs(tokenizer).items() if k not in ("return_dict_in_generate", "output_logits")
    }
    kwargs["num_beams"] = 1
    watch = GenerateWatch(model)
    said, said_again, facts = cold_then_warm(
        torch, lambda: pipeline_call(torch, pipe, kwargs), lambda: pipeline_call(torch, pipe, kwargs)
    )
    if len(watch.outputs) != 2:
        raise RuntimeError(f"the pipeline called generate() {len(watch.outputs)} times for two calls, not once each")
    first, second = watch.outputs
    # As the direct path reads it: one logit per generated token, the rest is the prompt (a decoder-only
    # model's input ids, or an encoder-decoder's decoder prompt).
    n_prompt = int(first.sequences.shape[1]) - len(first.logits)
    prefix = [int(t) for t in first.sequences[0, :n_prompt].tolist()] if model.config.is_encoder_decoder else None
    tokens = [int(t) for t in first.sequences[0, n_prompt:].tolist()]
    tokens_again = [int(t) for t in second.sequences[0, n_prompt:].tolist()]
    result = {
        "ran": True,
        "tokens": tokens,
        "tokens_again": tokens_again,
        "text": tokenizer.decode(tokens, skip_special_tokens=True),
        "pipeline_text": pipeline_text(said),
        "pipeline_text_again": pipeline_text(said_again),
        "repeat_identical": tokens == tokens_again,
        "prompt_tokens": n_prompt,
        # The prompt's own ids, as the direct path records them: scores are reused only after the same prefix.
        "prompt_ids": [int(t) for t in first.sequences[0, :n_prompt].tolist()],
        "top_logprobs": top_logprobs(torch, first.logits, tokens, SPEC["top_k"]),
        **facts,
        **placed,
    }
    if prefix is not None:  # the teacher-forced check scores the tokens after the same decoder prompt
        result["decoder_prompt_ids"] = prefix
    return result
