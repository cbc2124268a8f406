"""The public NEFF cache: pull what a compiler already built, publish what a sweep compiled.

Users of the seed document skip compilation by syncing, from one public bucket, the graphs the same
compiler built while this suite tested the model; so a sweep pulls that folder before it runs and
publishes its own cache after. Both are ``hf buckets sync`` runs (huggingface_hub's CLI), one
folder per compiler version.

torch-neuronx writes its on-disk cache as ``<dir>/ab/cd/<key>.neff`` through ``.tmp.XXXXXX``
files and keeps its locks in another directory (``shared/reference/torchneuron.md``, read in
torch-neuronx's ``PersistentCacheBackend.cpp`` / ``FileLock.cpp``). So a finished entry is a
non-empty ``*.neff`` file; anything else is a partial write or not the cache's, and publishing it
would hand every user a graph that fails to load.

This module never imports torch: it runs in the CI step that syncs, before or after the sweep.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

#: The public bucket of compiled graphs; one ``neuronxcc-<version>`` folder per compiler.
DEFAULT_BUCKET = "hf://buckets/aws-neuron/torch-neuronx-neff-cache"
#: torch-neuronx's default cache directory (``TORCH_NEURONX_NEFF_CACHE_DIR`` unset).
DEFAULT_CACHE_DIR = "/tmp/neff_cache"

_BUCKET_SCHEME = "hf://buckets/"
# A version names a folder of the bucket: dots, digits, letters and a local label ("+56dc5a86"),
# never a slash or "..", which would read from or publish into another compiler's folder.
_VERSION = re.compile(r"[0-9][0-9A-Za-z._+-]*")


class NeffCacheError(Exception):
    """A sync that cannot run, or that ran and moved nothing."""


class SyncFailed(NeffCacheError):
    """``hf buckets sync`` exited non-zero (or is not installed)."""


class NothingCopied(NeffCacheError):
    """A pull that added or changed no entry; ``report`` says what the cache holds."""

    def __init__(self, message: str, report: PullReport) -> None:
        super().__init__(message)
        self.report = report


class NothingStaged(NeffCacheError):
    """A push with no finished entry to publish."""


@dataclass(frozen=True)
class PullReport:
    """What one pull did to the local cache.

    Attributes:
        prefix: the bucket folder synced from.
        cache_dir: the local cache synced into.
        before: finished entries the cache held before the sync.
        after: finished entries it holds after.
        copied: entries the sync added or rewrote (new path, or a changed size or mtime).
    """

    prefix: str
    cache_dir: Path
    before: int
    after: int
    copied: int


@dataclass(frozen=True)
class PushReport:
    """What one push published (or, dry, would publish).

    Attributes:
        prefix: the bucket folder synced into.
        staged: finished entries staged, i.e. offered to the sync.
        command: the ``hf`` argv that ran (or would run).
        ran: False for a dry run.
    """

    prefix: str
    staged: int
    command: tuple[str, ...]
    ran: bool


def bucket_prefix(compiler_version: str, bucket: str = DEFAULT_BUCKET) -> str:
    """The bucket folder holding compiler ``compiler_version``'s graphs.

    ``compiler_version`` must be ``neuronxcc.__version__`` with its local label (what
    :func:`pytest_neuron_support.devices.compiler_version` reads): the published folders are named
    with it, and a sync of a wrong folder copies nothing and says nothing.
    """
    if compiler_version in ("", "none"):
        raise NeffCacheError(
            f"no neuronx-cc version ({compiler_version!r}): neuronx-cc is not installed here, so there is no "
            "NEFF cache folder to name; run on the trn2 host, or pass the version explicitly"
        )
    if not _VERSION.fullmatch(compiler_version) or ".." in compiler_version:
        raise NeffCacheError(f"{compiler_version!r} is not a compiler version (expected e.g. 2.15.128.0+56dc5a86)")
    if not bucket.startswith(_BUCKET_SCHEME) or len(bucket.rstrip("/")) <= len(_BUCKET_SCHEME):
        raise NeffCacheError(f"{bucket!r} is not a bucket (expected {_BUCKET_SCHEME}<namespace>/<name>)")
    return f"{bucket.rstrip('/')}/neuronxcc-{compiler_version}"


def _is_finished(path: Path, cache_dir: Path) -> bool:
    relative = path.relative_to(cache_dir)
    # Hidden names cover ".tmp.XXXXXX" writes (and anything a tool parks beside the entries); a
    # ".tmp." anywhere covers "<key>.neff.tmp.XXXXXX"-style names too.
    if any(part.startswith(".") or ".tmp." in part for part in relative.parts):
        return False
    if path.suffix != ".neff" or path.is_symlink():
        # A link could point anywhere on the runner; only files the compiler wrote are published.
        return False
    try:
        return path.is_file() and path.stat().st_size > 0
    except OSError:  # renamed or removed while we looked: not ours to publish
        return False


def finished_entries(cache_dir: Path) -> list[Path]:
    """The cache's complete entries (non-empty ``*.neff`` files, no partial write), sorted."""
    if not cache_dir.is_dir():
        return []
    return sorted(path for path in cache_dir.rglob("*.neff") if _is_finished(path, cache_dir))


def stage(cache_dir: Path, staging_dir: Path) -> int:
    """Hard-link (copy across filesystems) ``cache_dir``'s finished entries into ``staging_dir``,
    keeping their relative paths; returns how many were staged.

    Publishing a copy rather than the live cache means a compile finishing meanwhile can neither
    add a half-written file to the upload nor change one under it. ``staging_dir`` must be empty:
    whatever else it held would be published too.
    """
    if staging_dir.exists() and any(staging_dir.iterdir()):
        raise NeffCacheError(f"staging folder {staging_dir} is not empty: everything in it would be published")
    staged = 0
    for entry in finished_entries(cache_dir):
        target = staging_dir / entry.relative_to(cache_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            try:
                os.link(entry, target)
            except OSError:  # another filesystem, or links not allowed: copy (mtime kept for the sync)
                shutil.copy2(entry, target)
        except FileNotFoundError:  # removed since it was listed
            continue
        staged += 1
    return staged


def pull_command(version: str, cache_dir: Path | str, bucket: str = DEFAULT_BUCKET) -> list[str]:
    """``hf`` argv that syncs compiler ``version``'s bucket folder into ``cache_dir``.

    No ``--delete``: entries compiled here and not (yet) published must survive a pull.
    """
    return ["hf", "buckets", "sync", bucket_prefix(version, bucket), str(cache_dir)]


def push_command(version: str, staging_dir: Path | str, bucket: str = DEFAULT_BUCKET) -> list[str]:
    """``hf`` argv that syncs ``staging_dir`` into compiler ``version``'s bucket folder.

    No ``--delete``: the folder holds what every other sweep of this compiler published.
    """
    return ["hf", "buckets", "sync", str(staging_dir), bucket_prefix(version, bucket)]


def _snapshot(cache_dir: Path) -> dict[Path, tuple[int, int]]:
    snapshot: dict[Path, tuple[int, int]] = {}
    for entry in finished_entries(cache_dir):
        try:
            stat = entry.stat()
        except OSError:
            continue
        snapshot[entry.relative_to(cache_dir)] = (stat.st_size, stat.st_mtime_ns)
    return snapshot


def _sync(argv: list[str], hf: str) -> None:
    argv = [hf, *argv[1:]]
    try:
        # hf's own progress and errors go straight to the caller's terminal / CI log.
        done = subprocess.run(argv, check=False)
    except FileNotFoundError as exc:
        raise SyncFailed(f"{hf!r} not found: install huggingface_hub (it provides the hf CLI)") from exc
    if done.returncode != 0:
        raise SyncFailed(f"{' '.join(argv)} exited {done.returncode}")


def pull(version: str, cache_dir: Path, bucket: str = DEFAULT_BUCKET, hf: str = "hf") -> PullReport:
    """Sync compiler ``version``'s published graphs into ``cache_dir``.

    Raises :class:`NothingCopied` (carrying the report) when the sync added or changed no entry:
    a wrong version or bucket copies nothing and ``hf`` says nothing, so the caller must hear it.
    """
    argv = pull_command(version, cache_dir, bucket)
    cache_dir.mkdir(parents=True, exist_ok=True)
    before = _snapshot(cache_dir)
    _sync(argv, hf)
    after = _snapshot(cache_dir)
    copied = sum(1 for path, seen in after.items() if before.get(path) != seen)
    report = PullReport(argv[3], cache_dir, len(before), len(after), copied)
    if copied == 0:
        if report.after == 0:
            why = "the cache is still empty: the bucket has no entry for this compiler version, or the version is wrong"
        else:
            why = f"the cache already held all {report.after} entries, or the version or bucket is wrong"
        raise NothingCopied(f"copied nothing from {report.prefix} into {cache_dir}: {why}", report)
    return report


def _staging_parent(cache_dir: Path) -> str | None:
    # Beside the cache, hard links work (same filesystem); elsewhere stage() falls back to copies.
    parent = cache_dir.resolve().parent
    return str(parent) if os.access(parent, os.W_OK) else None


def push(
    version: str, cache_dir: Path, bucket: str = DEFAULT_BUCKET, hf: str = "hf", dry_run: bool = False
) -> PushReport:
    """Publish ``cache_dir``'s finished entries into compiler ``version``'s bucket folder.

    The entries are staged into a temporary folder first (:func:`stage`), so only finished entries
    are uploaded. A dry run stages and counts but does not run ``hf``. Raises :class:`NothingStaged`
    when the cache holds no finished entry, :class:`SyncFailed` when the sync fails. ``hf`` reads
    the token from the environment (``HF_TOKEN``); it never appears in the command.
    """
    prefix = bucket_prefix(version, bucket)
    with tempfile.TemporaryDirectory(prefix="neff-push-", dir=_staging_parent(cache_dir)) as tmp:
        staging = Path(tmp)
        argv = push_command(version, staging, bucket)
        staged = stage(cache_dir, staging)
        if staged == 0:
            raise NothingStaged(f"no finished NEFF entry under {cache_dir}: nothing to publish to {prefix}")
        if not dry_run:
            _sync(argv, hf)
    return PushReport(prefix, staged, tuple([hf, *argv[1:]]), ran=not dry_run)
