"""How this package writes a file: atomically and durably, in one place.

A reader (another worker, a resumed session, a crash-recovery pass) must see either the old file or
the whole new one, never half of it, and a file the function returned for must survive a power cut.
So the content goes to a temporary file beside the target (same filesystem, so the rename is
atomic), is flushed to disk, and is renamed over the target. The rendered ``run.py`` and
``judge.py`` write their own results the same way in a few lines of their own: they must stay
standalone scripts that import nothing from this package.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

#: The plugin's cache home (CPU references, config facts): NEURON_SUPPORT_CACHE, else this.
CACHE_HOME_ENV = "NEURON_SUPPORT_CACHE"
DEFAULT_CACHE_HOME = "~/.cache/neuron-support"


def cache_home(environ: Mapping[str, str] = os.environ) -> Path:
    """The folder the plugin's caches live in, unless an option or variable of their own says otherwise."""
    return Path(environ.get(CACHE_HOME_ENV) or DEFAULT_CACHE_HOME)


def write_atomic(path: Path, content: str | bytes | Callable[[Path], None], *, mode: int | None = None) -> Path:
    """Replace ``path`` with ``content`` atomically: text (UTF-8), bytes, or a function that writes
    the temporary file it is given (pyarrow's writers). ``mode`` sets the file's permission bits
    (temporary files are created 0600). Returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(name)
    try:
        if callable(content):
            os.close(fd)
            content(tmp)
        else:
            with os.fdopen(fd, "wb") as handle:
                handle.write(content.encode("utf-8") if isinstance(content, str) else content)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return path


def slug(model_id: str) -> str:
    """A directory name for a model id, a local path or a node id."""
    return re.sub(r"[^A-Za-z0-9._-]+", "--", model_id.strip("/")) or "model"
