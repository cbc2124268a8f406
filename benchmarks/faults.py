"""The planted-fault corpus: device-side faults of our own, as data, for benchmarks/planted_faults.py.

Each entry of :data:`FAULTS` is Python source that the plugin's ``pytest_neuron_support_post_load``
hook hands to the DEVICE run.py, which executes it right after loading the model with ``model``,
``torch`` and ``SPEC`` bound (in every rank of a sharded run; ``os.environ["RANK"]`` is the rank
there). The CPU reference never runs it, so whatever it changes is a device/reference difference
that a correct harness must reject (``expected == FAULT``) -- or, for the healthy stand-ins, a
difference of the size bf16 rounding makes, which it must accept (``expected == HEALTHY``).

Sources are self-contained (they are written into run.py, so a stored run.py still reproduces the
fault) and deterministic (fixed seeds: a rerun, and every rank, sees the same perturbation).

Two mechanisms, chosen so neither fights torch.compile (transformers 5 runs the prefill eagerly and
compiles the one-token decoding step):

* logits faults wrap ``model.generate`` (an instance attribute shadowing the method) so every call
  gets one more logits processor. Processors run eagerly between forward passes, see ``input_ids``
  (whose growth gives the step: 0 is the token chosen from the prefill's logits) and change the
  scores greedy decoding takes its argmax of. run.py records ``output_logits``, the RAW logits from
  before processors, as top_logprobs: for these faults the recorded logprobs are the healthy
  model's while the tokens are not.
* weight / activation faults change parameters in place or register a forward hook before the
  first generate(), so the compiled graphs are traced with them; the recorded logits are the
  faulty model's own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

#: ``expected`` values: a correct harness must reject the run (result not PASS), or accept it (PASS).
FAULT = "fault"
HEALTHY = "healthy"
#: ``applies_to`` values: which catalog entries a kind is planted into.
ALL = "all"
SHARDED = "sharded"  # entries with cores > 1 (ranks spawned)
SINGLE = "single"  # entries run in one process
APPLIES_TO = (ALL, SHARDED, SINGLE)
#: The environment variable naming the kind a session plants (read by the conftest the benchmark writes).
ENV_VAR = "NEURON_SUPPORT_PLANTED_FAULT"


@dataclass(frozen=True)
class Fault:
    """One planted kind.

    Attributes:
        description: what the device computes differently (and how the recorded logits look).
        expected: FAULT (a correct harness must not PASS it) or HEALTHY (it must PASS).
        applies_to: ALL, SHARDED or SINGLE catalog entries.
        source: the post-load Python source run.py executes.
        stage: the failure stage at which a correct harness FAILs the row (``parity`` or ``generate``);
            None for a healthy kind. A FAIL anywhere else did not catch the fault for what it is.
        position: the token index the row's evidence must name, where the fault fixes one: the first
            teacher-forced disagreement (stage ``parity``) or the warm run's divergence (``generate``).
            None where the fault changes tokens at no fixed index (then any disagreement is evidence).
    """

    description: str
    expected: str
    applies_to: str
    source: str
    stage: str | None = None
    position: int | None = None


# Shared prologue of the logits faults: wrap generate() so each call appends a fresh processor
# that calls the kind's ``_fault(step, call, pad, scores)``. A fresh processor per call keeps the
# step count right for the second (warm) generate(), and ``call`` lets a fault tell them apart.
_LOGITS = """
import transformers


class _PlantedFault(transformers.LogitsProcessor):
    def __init__(self, call, pad):
        self.call, self.pad, self.prompt = call, pad, None

    def __call__(self, input_ids, scores):
        if self.prompt is None:
            self.prompt = input_ids.shape[1]  # first call: scores of the prefill, step 0
        return _fault(input_ids.shape[1] - self.prompt, self.call, self.pad, scores)


_generate = model.generate
_calls = []


def _planted_generate(*args, **kwargs):
    _calls.append(None)
    processors = transformers.LogitsProcessorList(kwargs.pop("logits_processor", None) or [])
    processors.append(_PlantedFault(len(_calls), kwargs.get("pad_token_id")))
    return _generate(*args, logits_processor=processors, **kwargs)


model.generate = _planted_generate
"""

# Swapping the two best scores makes greedy decoding pick the runner-up: a plausible token the
# model itself ranked second, so the text stays language-like while being wrong.
_SECOND_BEST = """

def _second_best(scores):
    top = scores.topk(2, dim=-1).indices
    return scores.scatter(-1, top, scores.gather(-1, top.flip(-1)))
"""

# The language model's decoder layers, for any architecture the zoo has (model.layers,
# transformer.h; a VLM's language_model.layers -- not its vision tower's).
_LAYERS = """
_decoder = model.get_decoder()
_layers = getattr(_decoder, "layers", None) or getattr(_decoder, "h", None)
if not _layers:
    raise RuntimeError(f"planted fault: no decoder layers found in {type(_decoder).__name__}")
"""


def logits_fault(body: str) -> str:
    """A logits fault's source: ``body`` is the body of ``_fault(step, call, pad, scores)``, which returns
    the scores greedy decoding takes its argmax of (``_second_best(scores)`` swaps the two best)."""
    return _LOGITS + _SECOND_BEST + "\n\ndef _fault(step, call, pad, scores):\n" + body


_TABLE: dict[str, Fault] = {
    # --- faults: a correct harness must reject every one ---
    "second-best-once": Fault(
        "at decoding step 4 only, the top-1 and top-2 scores are swapped (logits processor): one token is the "
        "model's runner-up, the rest is decoded normally from there; recorded logits are the raw ones",
        FAULT,
        ALL,
        logits_fault("    return _second_best(scores) if step == 4 else scores\n"),
        stage="parity",
        position=4,
    ),
    "second-best-from-step-4": Fault(
        "from decoding step 4 on, the top-1 and top-2 scores are swapped at every step (logits processor): "
        "greedy decoding always takes the runner-up; recorded logits are the raw ones",
        FAULT,
        ALL,
        logits_fault("    return _second_best(scores) if step >= 4 else scores\n"),
        stage="parity",
        position=4,
    ),
    "late-second-best": Fault(
        "from decoding step 10 on (the first 10 tokens are right), the top-1 and top-2 scores are swapped "
        "(logits processor); recorded logits are the raw ones",
        FAULT,
        ALL,
        logits_fault("    return _second_best(scores) if step >= 10 else scores\n"),
        stage="parity",
        position=10,
    ),
    "rank1-shard-zeroed": Fault(
        "rank 1 only: its local tensor of every attention output and MLP down projection weight (experts' "
        "too) is zeroed; these are row-parallel under tensor parallelism, so rank 1's partial sums are missing "
        "from every all-reduce while rank 0's weights and partial sums are right; recorded logits are the "
        "faulty model's (halving them instead left the zoo's mistral decoding every token right)",
        FAULT,
        SHARDED,
        """
import os
import re
import sys

if os.environ.get("RANK") == "1":
    _out = re.compile(r"(o_proj|down_proj|c_proj|out_proj|fc2)\\.weight$|experts\\.down_proj$")
    _zeroed = []
    with torch.no_grad():
        for _name, _param in model.named_parameters():
            if _out.search(_name):
                _local = _param.to_local() if hasattr(_param, "to_local") else _param
                _local.zero_()
                _zeroed.append(_name)
    if not _zeroed:
        raise RuntimeError("planted rank1-shard-zeroed: no output projection found")
    print(f"[planted fault] rank1-shard-zeroed: rank 1 zeroed its shard of {_zeroed}", file=sys.stderr)
""",
        stage="parity",
    ),
    "dead-layer": Fault(
        "the first decoder layer adds nothing to the residual stream: its attention output projection and MLP "
        "down projection (weights and biases; every expert's in an MoE layer; the local shard on each rank) are "
        "zeroed, as a kernel that writes zeros would; recorded logits are the faulty model's",
        FAULT,
        ALL,
        _LAYERS
        + """
import re
import sys

# Layer 0, not a later one: the zoo's checkpoints have two layers and stay decisive without their
# last, while without their first every one of them decodes something else.
_out = re.compile(r"(^|\\.)(o_proj|down_proj|c_proj|out_proj|fc2)(\\.|$)")
_zeroed = []
with torch.no_grad():
    for _name, _param in _layers[0].named_parameters():
        if _out.search(_name):
            (_param.to_local() if hasattr(_param, "to_local") else _param).zero_()
            _zeroed.append(_name)
if not _zeroed:
    raise RuntimeError("planted dead-layer: no output projection in decoder layer 0")
print(f"[planted fault] dead-layer: zeroed layer 0's {_zeroed}", file=sys.stderr)
""",
        stage="parity",
    ),
    "prefill-off-by-one": Fault(
        "prefill only: decoder layer 0 writes its output over the prompt one position late (a forward hook rolls "
        "the sequence by one whenever more than one position goes through it, as a prefill kernel with an "
        "off-by-one in its output index would), so the first token and every prompt key and value above layer 0 "
        "come from the wrong positions; the one-token decoding steps (compiled) run layer 0 normally; recorded "
        "logits are the faulty model's",
        FAULT,
        ALL,
        _LAYERS
        + """

# A misplaced output rather than a missing or noisy one: these 2-layer copy-task models decode the
# prompt's continuation right without layer 0 over the prompt (qwen3_moe; mistral and qwen3_moe even
# with every layer skipped there), or with noise of 3 x the activations' std (gemma3_text), while
# every zoo model decodes otherwise when the prompt's positions are shifted.
def _prefill_off_by_one(module, args, kwargs, output):
    hidden = output[0] if isinstance(output, tuple) else output
    if hidden.dim() != 3 or hidden.shape[1] <= 1:
        return None  # a decoding step: one position, left alone (and traced as such when compiled)
    hidden = hidden.roll(1, dims=1)
    return (hidden, *output[1:]) if isinstance(output, tuple) else hidden


_layers[0].register_forward_hook(_prefill_off_by_one, with_kwargs=True)
""",
        stage="parity",
    ),
    "warm-run-second-best": Fault(
        "only the second (warm) generate() is wrong: from its step 4 on the top-1 and top-2 scores are swapped "
        "(logits processor); the first generate(), whose tokens and logits are recorded, is healthy",
        FAULT,
        ALL,
        logits_fault("    return _second_best(scores) if call >= 2 and step >= 4 else scores\n"),
        stage="generate",
        position=4,
    ),
    "embedding-rows-swapped": Fault(
        "the input embedding rows of the prompt's two most frequent tokens are swapped, on a private copy of "
        "the input embedding (a tied output head keeps the true rows), so the model reads each of the two as "
        "the other, in the prompt and in what it generates; recorded logits are the faulty model's",
        FAULT,
        ALL,
        """
import collections
import sys

import transformers

_tokenizer = transformers.AutoTokenizer.from_pretrained(SPEC["model"], revision=SPEC["revision"])
_ids = _tokenizer(SPEC["prompt"], add_special_tokens=False)["input_ids"]
(_a, _), (_b, _) = collections.Counter(_ids).most_common(2)
_embedding = model.get_input_embeddings()
with torch.no_grad():
    # A copy first: swapping rows an output head shares would relabel input and output alike,
    # which a model that copies its prompt undoes.
    _embedding.weight = torch.nn.Parameter(_embedding.weight.detach().clone(), requires_grad=False)
    _weight = _embedding.weight
    if hasattr(_weight, "full_tensor"):
        # Sharded (vocab-parallel) rows: swap in the gathered matrix, keep this rank's part of it.
        from torch.distributed.tensor import distribute_tensor

        _full = _weight.full_tensor()
        _full[[_a, _b]] = _full[[_b, _a]].clone()
        _weight.to_local().copy_(distribute_tensor(_full, _weight.device_mesh, _weight.placements).to_local())
    else:
        _weight[[_a, _b]] = _weight[[_b, _a]].clone()
print(f"[planted fault] embedding-rows-swapped: input rows {_a} and {_b} swapped", file=sys.stderr)
""",
        stage="parity",
    ),
    "dead-after-step-3": Fault(
        "a dead model from decoding step 3 on: every score is 0 but the pad token's (1), so greedy decoding "
        "emits the pad token (eos where pad is eos, which stops generation) for the rest (logits processor); "
        "recorded logits are the raw ones",
        FAULT,
        ALL,
        logits_fault(
            "    if step < 3:\n"
            "        return scores\n"
            "    dead = torch.zeros_like(scores)\n"
            "    dead[:, 0 if pad is None else pad] = 1.0\n"
            "    return dead\n"
        ),
        stage="parity",
        position=3,
    ),
    # --- healthy stand-ins: a correct harness must accept every one ---
    "no-op": Fault(
        "control: the hook's source is written into run.py but changes nothing",
        HEALTHY,
        ALL,
        "pass  # planted no-op: the device run is the unmodified model\n",
    ),
    "bf16-weight-jitter": Fault(
        "every floating-point weight is multiplied by (1 + e), e ~ N(0, 2^-9) per element (fixed seed, the same "
        "on every rank), computed in float32 and rounded back to the weights' dtype: the size of a bf16 "
        "rounding step, so some bf16 weights move by one ulp",
        HEALTHY,
        ALL,
        """
import sys

_generator = torch.Generator().manual_seed(0)
_moved = _total = 0
with torch.no_grad():
    for _name, _param in model.named_parameters():
        if not _param.is_floating_point():
            continue
        _local = _param.to_local() if hasattr(_param, "to_local") else _param
        _e = torch.randn(_local.shape, generator=_generator) * 2.0**-9
        _new = (_local.float().cpu() * (1 + _e)).to(_local.dtype)
        _moved += int((_new != _local.cpu()).sum())
        _total += _local.numel()
        _local.copy_(_new.to(_local.device))
print(f"[planted fault] bf16-weight-jitter: {_moved} of {_total} weights moved", file=sys.stderr)
""",
    ),
    "logit-jitter": Fault(
        "Gaussian jitter of 0.01 nats (fixed seed per step, the same in both generate() calls) is added to "
        "every score at every step (logits processor); recorded logits are the raw ones",
        HEALTHY,
        ALL,
        logits_fault(
            "    generator = torch.Generator().manual_seed(step)\n"
            "    noise = torch.randn(scores.shape, generator=generator) * 0.01\n"
            "    return scores + noise.to(scores.device, scores.dtype)\n"
        ),
    ),
}

#: kind -> Fault. Each source opens with a comment naming its kind, so a stored run.py says what was planted.
FAULTS: Mapping[str, Fault] = {
    kind: replace(
        fault, source=f"# planted {fault.expected} {kind!r} (benchmarks/faults.py)\n" + fault.source.lstrip("\n")
    )
    for kind, fault in _TABLE.items()
}


def applies(fault: Fault, cores: int | None) -> bool:
    """Whether ``fault`` is planted into a catalog entry that runs on ``cores`` (None: the planner's 1)."""
    sharded = (cores or 1) > 1
    return fault.applies_to == ALL or (fault.applies_to == SHARDED) == sharded


# The conftest each benchmark session loads: its post-load hook returns the source of the kind
# named by ENV_VAR, for the entries the kind applies to. It imports this module rather than holding a
# copy of the source, so the table stays the only definition.
_CONFTEST = """
import os
import sys

sys.path.insert(0, BENCH_DIR)
from faults import FAULTS, applies  # noqa: E402


def pytest_neuron_support_post_load(config, model):
    fault = FAULTS[os.environ["ENV_VAR"]]
    return fault.source if applies(fault, model.cores) else None
"""


def conftest(bench_dir: str) -> str:
    """The conftest.py source of a session; ``bench_dir`` is the directory holding this module."""
    return _CONFTEST.replace("BENCH_DIR", repr(bench_dir)).replace('"ENV_VAR"', repr(ENV_VAR))
