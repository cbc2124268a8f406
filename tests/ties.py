"""A tiny checkpoint with near-ties of known size at known positions, built from the tiny zoo's llama.

The free-running near-tie rule and the teacher-forced one both measure a miss in the CPU model's
distribution (how far below its top-1 the device's token is there), so a fault planted on the device
alone cannot make a small miss: the tie has to be in the checkpoint, and the device fault then picks
its runner-up. Here every residual branch is zeroed (as in tests/judges.py), so the next-token logits
depend only on the current token, and the output head is solved so that greedy decoding walks a fixed
cycle of ordinary tokens: after the prompt's last token comes ``cycle[0]``, after ``cycle[i]``
``cycle[i + 1]``. Every source token's top-1 is its successor at logit :data:`TOP`, its runner-up the
token after that at ``TOP - gap``, everything else at 0, so a device that takes the runner-up skips
one token of the cycle and, healthy from there on, walks on from it: the CPU's top-1 under the
device's own prefix again. In float32 the logprob gap between the two is ``gap`` to about 1e-6.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

#: The logit of every source token's successor; its runner-up's is ``TOP - gap``, every other token's 0.
TOP = 16.0


@dataclass(frozen=True)
class TieModel:
    """What :func:`build_tie_model` built: the CPU's greedy tokens (``cycle`` from its start, as many as
    asked for), the cycle, and the top-1/runner-up gap (nats) at each generation step of that healthy
    run."""

    path: Path
    tokens: tuple[int, ...]
    cycle: tuple[int, ...]
    gaps: tuple[float, ...]


def build_tie_model(
    zoo_cache: Path, out: Path, prompt: str, length: int, gaps: Mapping[int, float], default_gap: float
) -> TieModel:
    """Save the checkpoint to ``out``: at generation step ``j`` of the healthy run the top-1 leads the
    runner-up by ``gaps[j]`` nats, elsewhere by ``default_gap``; the cycle is long enough that a run
    which skips a token now and then does not come back to a tie within ``length`` steps."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    repo = zoo_cache / "models--tiny-random--llama"
    snapshot = repo / "snapshots" / (repo / "refs" / "main").read_text().strip()
    tokenizer = AutoTokenizer.from_pretrained(snapshot)
    model = AutoModelForCausalLM.from_pretrained(snapshot, dtype=torch.float32)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    # As run.py tokenizes the prompt: the logits after its last token choose generation step 0.
    last = int(tokenizer(prompt, return_tensors="pt")["input_ids"][0, -1])
    special = set(tokenizer.all_special_ids)
    size = length + 4
    cycle = [i for i in range(10, model.config.vocab_size) if i not in special and i != last][:size]
    sources = [last, *cycle]
    successor = {last: cycle[0], **{c: cycle[(i + 1) % size] for i, c in enumerate(cycle)}}
    runner_up = {last: cycle[1], **{c: cycle[(i + 2) % size] for i, c in enumerate(cycle)}}
    # The healthy run's step j is chosen after sources[j] (the prompt's last token, then cycle[j - 1]).
    gap_of = {source: gaps.get(j, default_gap) for j, source in enumerate(sources)}
    table = torch.zeros(len(sources), model.config.vocab_size, dtype=torch.float64)
    for row, source in enumerate(sources):
        table[row, successor[source]] = TOP
        table[row, runner_up[source]] = TOP - gap_of[source]
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        # What the output head sees for each source token (the final norm of its own embedding only).
        seen: list[torch.Tensor] = []
        handle = model.lm_head.register_forward_hook(lambda module, args, output: seen.append(args[0][0]))
        model(input_ids=torch.tensor([sources]))
        handle.remove()
        hidden = seen[0].double()
        # Solve hidden @ W.T == table: fewer source tokens than hidden units, so it is exact.
        weight = torch.linalg.lstsq(hidden, table).solution.T
        model.lm_head.weight.copy_(weight.float())
        logits = model(input_ids=torch.tensor([sources])).logits[0].double()
    if not torch.allclose(logits, table, atol=1e-4):
        raise AssertionError(f"the tie model's logits are off by {float((logits - table).abs().max())}")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return TieModel(out, tuple(cycle[:length]), tuple(cycle), tuple(gap_of[s] for s in sources[:length]))
