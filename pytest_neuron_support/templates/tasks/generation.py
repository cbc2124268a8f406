"""run.py's generation (``text-generation``, ``image-text-to-text``): greedy tokens with a static cache,
twice (the first compiles the decoding step with the device's backend, the second is timed warm); or,
with SPEC["forced_tokens"], the teacher-forced CPU check of a device run's tokens; or, with SPEC["locate"],
one forward at the first bad token with every module's output recorded (run.py's locate_modules).

Spliced into run.py after its inputs fragment (text.py or vision.py, which define PREPROCESSOR and
task_inputs); see text.py.
"""

from __future__ import annotations

from run import SPEC, cold_then_warm, enter, locate_modules, placed, task_inputs

# isort: split
# @@TASK@@
import time

#: What compiles (the message of a run that compiled nothing names it).
COMPILED_CALL = "generate()"


def generate_kwargs(tokenizer):
    from transformers import CompileConfig

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    kwargs = {
        "max_new_tokens": SPEC["max_new_tokens"],
        "do_sample": False,
        "cache_implementation": "static",
        "output_logits": True,
        "return_dict_in_generate": True,
        "pad_token_id": pad,
    }
    if SPEC["compile"]:
        config = CompileConfig(backend=SPEC["compile_backend"], dynamic=False, mode="default")
        if SPEC["device"]["force_compile"]:
            # generate() only auto-compiles on accelerators; this flag forces it elsewhere.
            config._compile_all_devices = True
        kwargs["compile_config"] = config
    else:
        kwargs["disable_compile"] = True
    return kwargs


def top_logprobs(torch, logits, tokens, k):
    out = []
    for step, token in zip(logits, tokens, strict=False):
        logprobs = torch.log_softmax(step[0].detach().float().cpu(), dim=-1)
        values, ids = logprobs.topk(k)
        out.append(
            {
                "ids": ids.tolist(),
                "logprobs": [round(v, 6) for v in values.tolist()],
                "chosen_logprob": round(float(logprobs[token]), 6),
            }
        )
    return out


class StepClock:
    """A generate() streamer that only notes when each new token reaches the host (its first put is
    the prompt). Tokens reach the host every step anyway (the stopping check reads them), so it
    changes neither the graphs nor the tokens."""

    def __init__(self):
        self.start = time.perf_counter()
        self.times = []

    def put(self, value):
        self.times.append(time.perf_counter())

    def end(self):
        pass

    def split(self):
        """(seconds to the first new token, new tokens per second after it, seconds from the first new
        token to the last); None where unknown. The rate is the tokens after the first over that span,
        which ends at the last token: generate()'s own work after it is in generate_s only."""
        steps = self.times[1:]
        if not steps:
            return None, None, None
        span = steps[-1] - steps[0]
        return steps[0] - self.start, ((len(steps) - 1) / span if len(steps) > 1 and span > 0 else None), span


def run_generation(torch, preprocessor, model):
    # Text and image inputs stay on CPU on purpose (generate() moves what the forward consumes, and the growing
    # tensors stay static there); an encoder's audio features are put on the device by task_inputs itself.
    inputs, tokenizer = task_inputs(torch, preprocessor, model)
    kwargs = generate_kwargs(tokenizer)
    clock = None

    def warm():
        # The warm run's clock starts with it, as the timing of the whole call does.
        nonlocal clock
        clock = StepClock()
        return model.generate(**inputs, **kwargs, streamer=clock)

    first, second, facts = cold_then_warm(torch, lambda: model.generate(**inputs, **kwargs), warm)
    first_token_s, decode_rate, decode_s = clock.split()

    # What precedes the generated tokens in the output: the prompt (a decoder-only model's input ids), or
    # an encoder-decoder's decoder prompt (Whisper's start-of-transcript and task tokens); one logit each
    # generated token.
    n_prompt = int(first.sequences.shape[1]) - len(first.logits)
    prefix = [int(t) for t in first.sequences[0, :n_prompt].tolist()] if model.config.is_encoder_decoder else None
    tokens = [int(t) for t in first.sequences[0, n_prompt:].tolist()]
    tokens_again = [int(t) for t in second.sequences[0, n_prompt:].tolist()]
    result = {
        "tokens": tokens,
        "tokens_again": tokens_again,
        "text": tokenizer.decode(tokens, skip_special_tokens=True),
        "repeat_identical": tokens == tokens_again,
        "prompt_tokens": n_prompt,
        # The prompt's own ids: a reference's teacher-forced scores are reused only after the same prefix.
        "prompt_ids": [int(t) for t in first.sequences[0, :n_prompt].tolist()],
        "top_logprobs": top_logprobs(torch, first.logits, tokens, SPEC["top_k"]),
        "special_ids": sorted(int(i) for i in tokenizer.all_special_ids),
        "eos_id": tokenizer.eos_token_id,
        **facts,
        "time_to_first_token_s": first_token_s,
        "decode_tokens_per_s": decode_rate,
        "decode_s": decode_s,
    }
    if prefix is not None:  # the teacher-forced check scores the tokens after the same decoder prompt
        result["decoder_prompt_ids"] = prefix
    if SPEC.get("score_own_tokens"):
        # The teacher-forced pass over this run's own tokens: when a device run generated the very
        # same tokens, this is its CPU check too, at the cost of one forward here.
        enter("check")
        result["forced"] = score_tokens(torch, model, inputs, tokens, prefix)
    return result


def score_tokens(torch, model, inputs, tokens, prefix=None):
    """One eager forward over the inputs plus ``tokens``: per token, the model's top-1 and top-k under
    the prefix before it, the token's logprob, its rank (0 = top-1) and its deficit to the top-1. An
    encoder-decoder's tokens follow its decoder prompt (``prefix``) on the decoder side."""
    if not tokens:
        return []
    n_prompt, full = followed_by(torch, inputs, tokens, prefix)
    with torch.no_grad():
        logits = model(**full, use_cache=False).logits
    # The logits at position p predict the token at p + 1: the prompt's last one predicts token 0.
    window = logits[0, n_prompt - 1 : n_prompt - 1 + len(tokens)].detach().float().cpu()
    logprobs = torch.log_softmax(window, dim=-1)
    positions = []
    for index, token in enumerate(tokens):
        row = logprobs[index]
        values, ids = row.topk(SPEC["top_k"])
        chosen = float(row[token])
        positions.append(
            {
                "token": int(token),
                "top1": int(ids[0]),
                "logprob": round(chosen, 6),
                "rank": int((row > row[token]).sum()),
                "deficit": round(float(values[0]) - chosen, 6),
                "ids": ids.tolist(),
                "logprobs": [round(v, 6) for v in values.tolist()],
            }
        )
    return positions


def followed_by(torch, inputs, tokens, prefix=None):
    """(the prompt's length, the inputs followed by ``tokens``): a decoder-only model's prompt ids extended
    (its per-token inputs with them), an encoder-decoder's decoder prompt (``prefix``) and then the tokens."""
    if prefix is not None:
        return len(prefix), {**inputs, "decoder_input_ids": torch.tensor([[*prefix, *tokens]], dtype=torch.long)}
    n_prompt = int(inputs["input_ids"].shape[1])
    extra = torch.tensor([tokens], dtype=inputs["input_ids"].dtype)
    full = {}
    for key, value in inputs.items():
        if key == "input_ids":
            value = torch.cat([value, extra], dim=1)
        elif hasattr(value, "dim") and value.dim() == 2 and value.shape[1] == n_prompt:
            # Per-token inputs follow the tokens: attend to every one, text type for the rest.
            fill = torch.ones_like(extra) if key == "attention_mask" else torch.zeros_like(extra)
            value = torch.cat([value, fill.to(value.dtype)], dim=1)
        full[key] = value
    return n_prompt, full


def locate_call(torch, preprocessor, model):
    """The forward the first diverging module is looked for in: the prompt followed by the device's tokens
    up to the first bad one (SPEC["locate"]["tokens"]), whose last logits chose it; an encoder-decoder's
    after its decoder prompt. Every input on the model's device (a direct forward, which generate() is not,
    moves nothing itself), a vision input's pixels in the weights' dtype at each call (the CPU side runs it
    in float32 and then in the device's dtype)."""
    options = SPEC["locate"]
    inputs, _ = task_inputs(torch, preprocessor, model)
    _, full = followed_by(torch, inputs, [int(t) for t in options["tokens"]], options.get("prefix"))

    def call(forward):
        weights = next(forward.parameters())  # the model it runs on: the device's, or a CPU copy
        return forward(**placed(full, weights.device, weights.dtype), use_cache=False)

    return call


def run_teacher_forced(torch, preprocessor, model):
    inputs, _ = task_inputs(torch, preprocessor, model)
    # An encoder-decoder's tokens are scored after the device run's own decoder prompt.
    prefix = SPEC["task_options"].get("forced_prefix")
    enter("check")
    start = time.perf_counter()
    positions = score_tokens(torch, model, inputs, [int(t) for t in SPEC["forced_tokens"]], prefix)
    return {
        "forced": positions,
        "tokens": [],
        "prompt_tokens": len(prefix) if prefix is not None else int(inputs["input_ids"].shape[1]),
        "forced_s": time.perf_counter() - start,
    }


def prepare_task():
    """Nothing to read before the first call (the embedding fragment reads its pooling here)."""
    return None


def run_task(torch, preprocessor, model, state):
    """The teacher-forced CPU check when SPEC["forced_tokens"] is set, else the generation."""
    if SPEC.get("locate"):
        return locate_modules(torch, model, locate_call(torch, preprocessor, model))
    if SPEC.get("forced_tokens") is not None:
        return run_teacher_forced(torch, preprocessor, model)
    return run_generation(torch, preprocessor, model)
