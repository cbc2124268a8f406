"""Secrets out of everything a run leaves behind: the value of every token variable in the
environment is replaced with ``***`` in text (row errors, terminal output) and in the files a
run writes (log.txt, result.json and the ranks' results).

It lives in the room below everything because the process harness (``run.execution``, which writes the
files), the CPU-side runs and the rows (which keep errors) all need it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from pytest_neuron_support.base.storage import write_atomic

#: The environment variables whose values are credentials: huggingface_hub reads the first two,
#: older tools the others.
SECRET_VARS: tuple[str, ...] = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_TOKEN", "HF_API_TOKEN")
#: Shorter values are left alone: replacing every "1" or "ab" in a log would garble it and hide
#: nothing a real token needs hidden.
MIN_SECRET_CHARS = 4
MASK = "***"


def secret_values(*envs: Mapping[str, str]) -> list[str]:
    """The secret values set in any of ``envs``, longest first (so a value that contains another
    is replaced whole, not left with the inner one masked and the rest readable)."""
    values = {e[name] for e in envs for name in SECRET_VARS if len(e.get(name) or "") >= MIN_SECRET_CHARS}
    return sorted(values, key=len, reverse=True)


def scrub(text: str | None, env: Mapping[str, str] = os.environ) -> str | None:
    """``text`` with the value of every secret variable of ``env`` replaced by ``***``."""
    if text is None:
        return None
    for value in secret_values(env):
        text = text.replace(value, MASK)
    return text


def scrub_files(paths: Iterable[Path], *envs: Mapping[str, str]) -> None:
    """Rewrite each existing file in ``paths`` with the secrets of ``envs`` masked.

    Bytes, not text: a log may hold output that is not UTF-8, which must survive unchanged. A
    file is rewritten only when it holds a secret, atomically, so a reader never sees it
    half-written; its permission bits are kept.
    """
    values = [v.encode() for v in secret_values(*envs)]
    if not values:
        return
    for path in paths:
        try:
            data = path.read_bytes()
        except OSError:
            continue
        cleaned = data
        for value in values:
            cleaned = cleaned.replace(value, MASK.encode())
        if cleaned == data:
            continue
        write_atomic(path, cleaned, mode=path.stat().st_mode & 0o7777)
