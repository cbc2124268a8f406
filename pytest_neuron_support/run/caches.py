"""Caches that make a rerun cheap: CPU reference results, and the device's compile cache.

A reference result depends only on the checkpoint, the prompt, the token count, the dtype and
the CPU stack, never on the device under test, so a rerun (another compiler version, another
shard, a resumed sweep) reuses it. Entries are keyed by everything that shapes them and also
carry the commit of the snapshot their run.py loaded (run.py reads it from the Hugging Face cache's
``snapshots/<commit>`` folder its files resolved to): an entry is used only for a device run that
loaded the same commit, so a moved branch is a miss, never a stale hit.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_neuron_support.base.storage import write_atomic
from pytest_neuron_support.data.records import Stack
from pytest_neuron_support.run.runscript import RunSpec

#: What a CPU run's result holds; bumped when that changes, so older cache entries are misses.
#: 3: a Hub model's result records the commit of the snapshot it loaded (2 recorded none with
#: transformers 5, so its entries matched any commit).
RESULT_FORMAT = 3

#: A partial cache file untouched for this long belongs to a writer that died.
STALE_LOCK_S = 3600.0


def reference_key(spec: RunSpec, stack: Stack) -> str:
    """Cache key of a CPU run (free-running reference or teacher-forced check): everything in the
    spec that shapes its result (model, revision, task, dtype, prompt, tokens, top-k, the embedded
    sentences, the image, the tokens it scores), the torch and transformers versions, and
    :data:`RESULT_FORMAT`."""
    parts = {
        "format": RESULT_FORMAT,
        "model": spec.model,
        "revision": spec.revision,
        "task": spec.task,
        "dtype": spec.dtype,
        "prompt": spec.prompt,
        "max_new_tokens": spec.max_new_tokens,
        "top_k": spec.top_k,
        "sentences": list(spec.sentences),
        "image_size": list(spec.image_size),
        "forced_tokens": None if spec.forced_tokens is None else list(spec.forced_tokens),
        "score_own_tokens": spec.score_own_tokens,
        "task_options": dict(spec.task_options),
        "torch": stack.torch,
        "transformers": stack.library_version,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def is_local(model: str) -> bool:
    """Whether ``model`` is a local folder: transformers' own test (``os.path.isdir``) before it asks
    the Hub, so a folder run.py loads as files is one here too. A folder has no commit."""
    return os.path.isdir(model)


def hub_cache_dir(environ: Mapping[str, str]) -> Path:
    """The Hugging Face cache a run started with ``environ`` reads, in huggingface_hub's own order
    (``constants.HF_HUB_CACHE``): HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE, HF_HOME/hub,
    XDG_CACHE_HOME/huggingface/hub, ~/.cache/huggingface/hub."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if environ.get(name):
            return Path(environ[name]).expanduser()
    if environ.get("HF_HOME"):
        return Path(environ["HF_HOME"]).expanduser() / "hub"
    base = Path(environ["XDG_CACHE_HOME"]) if environ.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base.expanduser() / "huggingface" / "hub"


def cached_commit(model: str, revision: str, environ: Mapping[str, str]) -> str | None:
    """The commit ``revision`` of Hub model ``model`` resolves to in the Hugging Face cache of ``environ``
    (``refs/<revision>``, or the revision itself when it is a commit), when its ``snapshots/<commit>`` is
    there: the snapshot an offline run.py loads. None for a local folder, or one not in the cache yet.

    Read without a request: a branch that moved on the Hub since the last download still reads as the
    old commit here, and the run that downloads it reports the new one, which is what decides a hit."""
    if is_local(model):
        return None
    from huggingface_hub.file_download import repo_folder_name

    repo = hub_cache_dir(environ) / repo_folder_name(repo_id=model, repo_type="model")
    try:
        ref = repo / "refs" / revision
        commit = ref.read_text(encoding="utf-8").strip() if ref.is_file() else revision
    except (OSError, ValueError):
        return None
    return commit if commit and (repo / "snapshots" / commit).is_dir() else None


class ReferenceCache:
    """CPU reference results on disk, one JSON file per key (atomic writes)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def get(self, key: str, commit: str | None, *, local: bool = False) -> Mapping[str, Any] | None:
        """The cached result for ``key``, if it is of ``commit``, the commit of the snapshot the device
        run loaded. ``commit`` None matches an entry of none only for a ``local`` folder (which has no
        commit): a Hub model whose commit is unknown is never handed another run's result."""
        if commit is None and not local:
            return None
        try:
            data = json.loads((self.directory / f"{key}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not data.get("ok") or data.get("commit") != commit:
            return None
        return dict(data)

    def has(self, key: str) -> bool:
        """Whether a good result for ``key`` is stored (for any commit)."""
        try:
            return bool(json.loads((self.directory / f"{key}.json").read_text(encoding="utf-8")).get("ok"))
        except (OSError, ValueError):
            return False

    def put(self, key: str, result: Mapping[str, Any]) -> None:
        write_atomic(self.directory / f"{key}.json", json.dumps(result))


def clean_compile_cache(directory: Path, now: float | None = None) -> list[Path]:
    """Remove what a compile that died leaves in torch-neuronx's on-disk NEFF cache.

    ``directory`` is ``--neff-cache``: on neuron the base of one cache per compiler version
    (``neffcache.local_cache_dir``), all of them cleaned here, as the walk goes through every folder.
    Each cache (``TORCH_NEURONX_NEFF_CACHE_DIR``) holds ``<dir>/ab/cd/<key>.neff``, each written
    through a ``.tmp.XXXXXX`` file renamed into place (torch-neuronx ``PersistentCacheBackend``):
    a writer killed mid-write leaves its ``.tmp.*`` file behind, and a ``.neff`` left empty is no
    entry at all. Those two are removed; a ``.tmp.*`` touched within :data:`STALE_LOCK_S` may be a
    live writer's and stays. Locks live elsewhere (``TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR``) and the
    runtime breaks stale ones itself, so none are touched. On cpu/cuda the same directory is
    inductor's cache, which leaves no such files. Returns what was removed.
    """
    now = time.time() if now is None else now
    removed: list[Path] = []
    if not directory.is_dir():
        return removed
    for path in directory.rglob("*"):
        with contextlib.suppress(OSError):
            if not path.is_file():
                continue
            stat = path.stat()
            partial = path.name.startswith(".tmp.") and now - stat.st_mtime > STALE_LOCK_S
            empty = path.suffix == ".neff" and stat.st_size == 0
            if partial or empty:
                path.unlink()
                removed.append(path)
    return removed
