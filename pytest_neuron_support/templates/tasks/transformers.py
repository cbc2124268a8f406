"""run.py's loading for a transformers model: the task's preprocessor (its fragment's PREPROCESSOR)
and ``from_pretrained(..., dtype=..., device_map=<device>)`` with the task's Auto class, or sharded
with ``DistributedConfig`` (the candidates of SPEC["distributed_configs"] in order, the first that
loads recorded with what failed before it).

Spliced into run.py (pytest-neuron-support's runscript) before the task's own fragments, in place of
run.py's @@TASK@@ import; what is above the marker line is not spliced (it names what the code uses
from run.py and the task's fragments, so ruff checks this file as the code it becomes).
"""

from __future__ import annotations

from run import PREPROCESSOR, SPEC

# isort: split
# @@TASK@@


def load(torch, facts):
    """(tokenizer or processor, model) for SPEC's task, placed on the device: from_pretrained with
    device_map=<device>, or sharded with DistributedConfig (each candidate of SPEC in order)."""
    import transformers

    auto_class = SPEC["auto_class"]
    common = {"revision": SPEC["revision"], "trust_remote_code": SPEC["trust_remote_code"]}
    # The task's preprocessor (its fragment's PREPROCESSOR: a tokenizer, or a VLM's processor).
    preprocessor = getattr(transformers, PREPROCESSOR).from_pretrained(SPEC["model"], **common)
    kwargs = {"dtype": getattr(torch, SPEC["dtype"]), "device_map": SPEC["device"]["device_map"], **common}
    candidates = SPEC["distributed_configs"] or [None]
    attempts = []
    for candidate in candidates:
        if candidate is not None:
            from transformers.distributed import DistributedConfig

            # transformers refuses device_map next to tensor parallelism: the device mesh
            # places each rank on its own device (neuron:LOCAL_RANK, cuda:LOCAL_RANK, cpu).
            kwargs.pop("device_map", None)
            kwargs["distributed_config"] = DistributedConfig(**candidate)
        try:
            model = getattr(transformers, auto_class).from_pretrained(SPEC["model"], **kwargs)
        except Exception as exc:
            if candidate is None or candidate is candidates[-1]:
                raise
            # Which sharding configs work differs between transformers versions: try the
            # next one, and keep what failed as evidence.
            attempts.append({"config": candidate, "error": f"{type(exc).__name__}: {exc}"[:1000]})
            continue
        facts["distributed_config"] = candidate
        facts["distributed_attempts"] = attempts
        model.eval()
        return preprocessor, model
