"""Caches that make a rerun cheap: CPU reference results, and the device's compile cache.

A reference result depends only on the checkpoint, the prompt, the token count, the dtype and
the CPU stack, never on the device under test, so a rerun (another compiler version, another
shard, a resumed sweep) reuses it. Entries are keyed by everything that shapes them and also
carry the commit the revision resolved to: a moved branch is a miss, never a stale hit.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_neuron_support.base.storage import write_atomic
from pytest_neuron_support.data.records import Stack
from pytest_neuron_support.run.runscript import RunSpec

#: What a CPU run's result holds; bumped when that changes, so older cache entries are misses.
RESULT_FORMAT = 2

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


class ReferenceCache:
    """CPU reference results on disk, one JSON file per key (atomic writes)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def get(self, key: str, commit: str | None) -> Mapping[str, Any] | None:
        """The cached result for ``key``, if its commit matches the device run's."""
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
