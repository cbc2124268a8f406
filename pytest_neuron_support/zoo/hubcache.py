"""The Hugging Face hub cache layout: installing a built checkpoint as ``models--org--name/blobs``,
``snapshots/<commit>`` and ``refs/main``, the way ``huggingface_hub`` itself leaves a download."""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
from pathlib import Path

from pytest_neuron_support.base.storage import write_atomic

# Files the Hub stores through git-LFS (named by sha256 in the cache); everything else is a plain git
# blob (named by its git blob sha1), as huggingface_hub names blobs by the file's etag.
_LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".gguf", ".npz")
_LFS_MIN_SIZE = 10 * 1024 * 1024
_FILE_MODE = 0o644  # what huggingface_hub leaves behind under the usual umask (mkstemp would give 0600)


def _repo_dir(cache_dir: Path, repo_id: str) -> Path:
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"repo id must look like 'org/name', got {repo_id!r}")
    return Path(cache_dir) / ("models--" + "--".join(parts))


def _file_etag(path: Path) -> str:
    size = path.stat().st_size
    if path.name.endswith(_LFS_SUFFIXES) or size >= _LFS_MIN_SIZE:
        h = hashlib.sha256()
    else:
        h = hashlib.sha1()
        h.update(f"blob {size}\0".encode())
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _copy(src: Path, dst: Path) -> None:
    shutil.copyfile(src, dst)


def install_snapshot(cache_dir: Path, repo_id: str, files_dir: Path) -> Path:
    """Install every file under ``files_dir`` as a Hub-cache snapshot of ``repo_id`` and point
    ``refs/main`` at it.

    Layout (as huggingface_hub writes it): ``<cache_dir>/models--<org>--<name>/blobs/<etag>`` (sha256 for
    LFS-style weight files, git blob sha1 otherwise), ``snapshots/<commit>/<path>`` as relative symlinks
    into ``blobs``, and ``refs/main`` holding ``<commit>``.  The 40-hex commit hash is derived from the
    file names and contents, so installing the same files twice gives the same commit.  Any content is
    accepted (tests use this to install deliberately broken checkpoints).  Returns the snapshot path.
    """
    files_dir = Path(files_dir)
    repo_dir = _repo_dir(cache_dir, repo_id)
    files = sorted(p for p in files_dir.rglob("*") if p.is_file())
    if not files:
        raise ValueError(f"no files to install under {files_dir}")
    entries = [(p.relative_to(files_dir).as_posix(), p, _file_etag(p)) for p in files]
    manifest = "".join(f"{rel}\0{etag}\n" for rel, _, etag in entries)
    commit = hashlib.sha1(f"tiny-zoo snapshot\n{repo_id}\n{manifest}".encode()).hexdigest()

    blobs = repo_dir / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    for _, src, etag in entries:
        blob = blobs / etag
        if not blob.exists():
            write_atomic(blob, functools.partial(_copy, src), mode=_FILE_MODE)

    snapshot = repo_dir / "snapshots" / commit
    for rel, _, etag in entries:
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        target = os.path.relpath(blobs / etag, link.parent)
        if link.is_symlink() and os.readlink(link) == target:
            continue
        tmp_link = link.parent / f".{link.name}.{os.getpid()}.tmp"
        if tmp_link.is_symlink() or tmp_link.exists():
            tmp_link.unlink()
        os.symlink(target, tmp_link)
        os.replace(tmp_link, link)

    write_atomic(repo_dir / "refs" / "main", commit, mode=_FILE_MODE)
    return snapshot


def _snapshot_path(cache_dir: Path, repo_id: str) -> Path | None:
    ref = _repo_dir(cache_dir, repo_id) / "refs" / "main"
    try:
        commit = ref.read_text().strip()
    except OSError:
        return None
    snapshot = _repo_dir(cache_dir, repo_id) / "snapshots" / commit
    return snapshot if snapshot.is_dir() else None


def installed(cache_dir: Path, repo_id: str) -> bool:
    """True when ``refs/main`` of ``repo_id`` points at a snapshot in ``cache_dir`` that has at least one
    file and no dangling symlinks (i.e. an offline ``from_pretrained`` can resolve it)."""
    snapshot = _snapshot_path(cache_dir, repo_id)
    if snapshot is None:
        return False
    entries = [p for p in snapshot.rglob("*") if not p.is_dir()]
    return bool(entries) and all(p.exists() for p in entries)


def _installed_fingerprint(cache_dir: Path, repo_id: str) -> str | None:
    snapshot = _snapshot_path(cache_dir, repo_id)
    if snapshot is None:
        return None
    try:
        card = (snapshot / "README.md").read_text()
    except OSError:
        return None
    for line in card.splitlines():
        if line.startswith("tiny_zoo_fingerprint:"):
            return line.split(":", 1)[1].strip()
    return None
