"""run.py's sentence embeddings (``feature-extraction``, ``sentence-similarity``): the tokenizer and the
model, a fixed list of sentences (SPEC["sentences"]) embedded with the pooling the checkpoint's
sentence-transformers config declares (modules.json, 1_Pooling/config.json; mean pooling without one);
the forward pass is compiled with torch.compile (device runs), run twice, and the embeddings written.

Spliced into run.py in place of its @@TASK@@ import; see text.py.
"""

from __future__ import annotations

from run import SPEC, cold_then_warm

# isort: split
# @@TASK@@
import json

#: The class run.py loads the preprocessor with.
PREPROCESSOR = "AutoTokenizer"
#: What compiles (the message of a run that compiled nothing names it).
COMPILED_CALL = "the forward pass"

#: sentence-transformers module types this script reproduces; any other (Dense, LayerNorm, ...)
#: stops the run at stage load rather than embedding without it.
TRANSFORMER_MODULE = "sentence_transformers.models.Transformer"
POOLING_MODULE = "sentence_transformers.models.Pooling"
NORMALIZE_MODULE = "sentence_transformers.models.Normalize"
#: sentence-transformers' legacy pooling flags, in the order it concatenates the modes.
POOLING_FLAGS = (
    ("pooling_mode_cls_token", "cls"),
    ("pooling_mode_max_tokens", "max"),
    ("pooling_mode_mean_tokens", "mean"),
    ("pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len_tokens"),
    ("pooling_mode_weightedmean_tokens", "weightedmean"),
    ("pooling_mode_lasttoken", "lasttoken"),
)


def read_repo_json(name):
    """A JSON file of the checkpoint (Hub cache, Hub or local directory), or None if it has none."""
    from transformers.utils import cached_file

    path = cached_file(
        SPEC["model"],
        name,
        revision=SPEC["revision"],
        _raise_exceptions_for_missing_entries=False,
        _raise_exceptions_for_connection_errors=False,
    )
    if path is None:
        return None
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def sentence_transformers_pooling():
    """How the checkpoint turns token states into a sentence embedding, as its sentence-transformers
    files declare it: {"modes": [...], "normalize": bool, "max_seq_length": int|None, "lowercase":
    bool, "source": where it came from}. A checkpoint without modules.json gets mean pooling."""
    modules = read_repo_json("modules.json")
    if modules is None:
        return {
            "modes": ["mean"],
            "normalize": False,
            "max_seq_length": None,
            "lowercase": False,
            "source": "default: no modules.json, mean pooling",
        }
    modes, normalize = None, False
    for module in modules:
        kind = module.get("type", "")
        if kind == TRANSFORMER_MODULE:
            continue
        if kind == POOLING_MODULE:
            config = read_repo_json(f"{module['path']}/config.json".lstrip("/")) or {}
            if "pooling_mode" in config:  # sentence-transformers >= 6 writes one key
                mode = config["pooling_mode"]
                modes = [mode] if isinstance(mode, str) else list(mode)
            else:
                modes = [name for flag, name in POOLING_FLAGS if config.get(flag)] or ["mean"]
        elif kind == NORMALIZE_MODULE:
            normalize = True
        else:
            raise NotImplementedError(
                f"sentence-transformers module {kind!r} ({module.get('path')}) is not reproduced by run.py; "
                "only Transformer, Pooling and Normalize are"
            )
    settings = read_repo_json("sentence_bert_config.json") or {}
    return {
        "modes": modes or ["mean"],
        "normalize": normalize,
        "max_seq_length": settings.get("max_seq_length"),
        "lowercase": bool(settings.get("do_lower_case")),
        "source": "modules.json",
    }


def pool(torch, hidden, mask, pooling):
    """sentence-transformers' pooling, in float32 on CPU (both runs alike), right-padded inputs."""
    # To the host first, then cast: the harness's own ops stay out of the device's fallback-op list.
    hidden = hidden.detach().to("cpu").float()
    mask = mask.detach().to("cpu").unsqueeze(-1).float()
    counts = mask.sum(dim=1).clamp(min=1e-9)
    vectors = []
    for mode in pooling["modes"]:
        if mode == "cls":
            vectors.append(hidden[:, 0])
        elif mode == "max":
            vectors.append(hidden.masked_fill(mask == 0, float("-inf")).max(dim=1).values)
        elif mode == "mean":
            vectors.append((hidden * mask).sum(dim=1) / counts)
        elif mode == "mean_sqrt_len_tokens":
            vectors.append((hidden * mask).sum(dim=1) / counts.sqrt())
        elif mode == "weightedmean":
            weights = torch.arange(1, hidden.shape[1] + 1, dtype=torch.float32).view(1, -1, 1) * mask
            vectors.append((hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9))
        elif mode == "lasttoken":
            last = mask.squeeze(-1).sum(dim=1).long() - 1
            vectors.append(hidden[torch.arange(hidden.shape[0]), last.clamp(min=0)])
        else:
            raise NotImplementedError(f"pooling mode {mode!r} is not reproduced by run.py")
    pooled = torch.cat(vectors, dim=-1)
    if pooling["normalize"]:
        pooled = torch.nn.functional.normalize(pooled, p=2, dim=-1)
    return pooled


def run_embedding(torch, tokenizer, model, pooling):
    sentences = [s.lower() if pooling["lowercase"] else s for s in SPEC["sentences"]]
    limit = pooling["max_seq_length"]
    batch = tokenizer(sentences, padding=True, truncation=limit is not None, max_length=limit, return_tensors="pt")
    device = next(model.parameters()).device
    inputs = {key: value.to(device) for key, value in batch.items()}
    forward = model
    if SPEC["compile"]:
        # One static-shape graph of the whole encoder, with the device's backend.
        forward = torch.compile(model, backend=SPEC["compile_backend"], dynamic=False, mode="default")

    def embed():
        with torch.no_grad():
            out = forward(**inputs)
        hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        return pool(torch, hidden, batch["attention_mask"], pooling)

    first, second, facts = cold_then_warm(torch, embed, embed)
    embeddings = first.tolist()
    noise = {}
    noise_dtype = SPEC["task_options"].get("noise_dtype")
    if noise_dtype:
        # The CPU reference (in float32) embeds again in the device's dtype: the dtype's own noise, which the
        # calibrated tolerance rule judges the device's distance from float32 against.
        if noise_dtype != SPEC["dtype"]:
            model.to(getattr(torch, noise_dtype))
            noise = {"noise_embeddings": embed().tolist(), "noise_dtype": noise_dtype}
        else:
            noise = {"noise_embeddings": embeddings, "noise_dtype": noise_dtype}
    return {
        "embeddings": embeddings,
        **noise,
        "pooling": pooling,
        "tokens": [],
        "text": None,
        "repeat_identical": embeddings == second.tolist(),
        "prompt_tokens": int(batch["input_ids"].shape[1]),
        **facts,
    }


def prepare_task():
    """How the checkpoint pools its token states (read once, with the model's loading)."""
    return sentence_transformers_pooling()


def run_task(torch, preprocessor, model, state):
    return run_embedding(torch, preprocessor, model, state)
