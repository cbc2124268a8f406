"""The public NEFF cache: pull what a compiler already built, publish what a sweep compiled.

Users of the seed document skip compilation by syncing, from one public bucket, the graphs the same
compiler built while this suite tested the model; so a sweep pulls that folder before it runs and
publishes its own cache after. Both are ``hf buckets sync`` runs (huggingface_hub's CLI), one
folder per compiler version.

torch-neuronx writes its on-disk cache in two layouts (``shared/reference/torchneuron.md``, read in
torch-neuronx's ``PersistentCacheBackend.cpp`` / ``kernels/compiler_subprocess.py``): the C++
compilation cache as ``<dir>/ab/cd/<key>.neff`` (``ab``/``cd`` the key's first two hex pairs, a
32-hex key, written through ``.tmp.XXXXXX`` files; an empty file reads as a miss) and Python kernels
as ``<dir>/<sha256>/<sha256>.neff``. A finished entry is a non-empty ``.neff`` at one of those paths;
anything else is a partial write or another tool's layout (libneuronxla's ``MODULE_*/model.neff``),
which torch-neuronx never reads: a pull counts it as foreign, a push never publishes it.

That cache's keys hold no compiler version (``KernelExecution.cpp``: stablehlo hash, target, LNC,
opt level, args), so one directory shared across compiler upgrades would serve NEFFs the old compiler
built, and a push would publish them under the new compiler's folder. Every local cache is therefore
one folder per compiler, ``<base>/neuronxcc-<version>`` (:func:`local_cache_dir`), which the pull,
the runs (``TORCH_NEURONX_NEFF_CACHE_DIR``, :func:`run_cache_dir`) and the push all take from here.

This module never imports torch: it runs in the CI step that syncs, before or after the sweep.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pytest_neuron_support.devices.table import DeviceKind

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
        cache_dir: the local cache synced into (``<base>/neuronxcc-<version>``).
        before: finished entries the cache held before the sync.
        after: finished entries it holds after.
        copied: entries the sync added or rewrote (new path, or a changed size or mtime).
        foreign: files the sync added or rewrote that are not in a layout torch-neuronx reads (relative
            paths, sorted): another tool's cache, empty or partial ``.neff`` files.
    """

    prefix: str
    cache_dir: Path
    before: int
    after: int
    copied: int
    foreign: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line for the log; names the foreign files (the first few) when there are any."""
        text = (
            f"pulled {self.copied} entries from {self.prefix} into {self.cache_dir} "
            f"(it held {self.before}, now {self.after})"
        )
        if self.foreign:
            text += f"; {_foreign_text(self.foreign)}"
        return text


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
    _check_version(compiler_version)
    if not bucket.startswith(_BUCKET_SCHEME) or len(bucket.rstrip("/")) <= len(_BUCKET_SCHEME):
        raise NeffCacheError(f"{bucket!r} is not a bucket (expected {_BUCKET_SCHEME}<namespace>/<name>)")
    return f"{bucket.rstrip('/')}/neuronxcc-{compiler_version}"


def _check_version(compiler_version: str) -> None:
    if compiler_version in ("", "none"):
        raise NeffCacheError(
            f"no neuronx-cc version ({compiler_version!r}): neuronx-cc is not installed here, so there is no "
            "NEFF cache folder to name; run on the trn2 host, or pass the version explicitly"
        )
    if not _VERSION.fullmatch(compiler_version) or ".." in compiler_version:
        raise NeffCacheError(f"{compiler_version!r} is not a compiler version (expected e.g. 2.15.128.0+56dc5a86)")


def local_cache_dir(base: Path | str, compiler_version: str) -> Path:
    """The local NEFF cache of compiler ``compiler_version``: ``<base>/neuronxcc-<version>``, the same
    folder name as the bucket's. The one place that names it: ``neff pull`` syncs into it, the runs get
    it as ``TORCH_NEURONX_NEFF_CACHE_DIR`` (:func:`run_cache_dir`), ``neff push`` stages from it, so a
    NEFF another compiler built is neither served nor published."""
    _check_version(compiler_version)
    return Path(base) / f"neuronxcc-{compiler_version}"


def session_cache_base(kind: DeviceKind, given: Path | None, environ: Mapping[str, str]) -> Path | None:
    """The base of the compile caches a session's device runs use: ``--neff-cache`` when given; else,
    where the kind keeps one cache per compiler version (neuron), the base ``neff pull`` and ``neff push``
    default to (``$TORCH_NEURONX_NEFF_CACHE_DIR``, else torch-neuronx's own default), so a sweep run
    without the option still compiles into, and reads from, the folder a pull filled; else None (the
    run keeps the cache its environment names: inductor's)."""
    if given is not None or not kind.compile_cache_per_compiler:
        return given
    return Path(environ.get(kind.compile_cache_env) or DEFAULT_CACHE_DIR)


def run_cache_dir(kind: DeviceKind, base: Path, compiler_version: str) -> Path:
    """The compile cache directory a device run gets for ``--neff-cache=base``: the compiler's own
    folder (:func:`local_cache_dir`) where the kind's cache keys hold no compiler version
    (``compile_cache_per_compiler``: neuron), else ``base`` itself (inductor's keys hold the torch
    version and the code). A neuron host whose compiler version could not be read gets
    ``neuronxcc-unknown``, shared with no known compiler's entries."""
    if not kind.compile_cache_per_compiler:
        return base
    if compiler_version in ("", "none"):
        return Path(base) / "neuronxcc-unknown"
    return local_cache_dir(base, compiler_version)


_HEX32 = re.compile(r"[0-9a-fA-F]{32}")
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")


def _in_torch_neuronx_layout(relative: Path) -> bool:
    """``ab/cd/<32-hex>.neff`` with ``ab``/``cd`` the key's first two pairs (the C++ cache's
    ``GetShardedPath``), or ``<sha256>/<sha256>.neff`` (Python kernels)."""
    parts, stem = relative.parts, relative.stem
    if relative.suffix != ".neff":
        return False
    if len(parts) == 3 and _HEX32.fullmatch(stem):
        return parts[0] == stem[:2] and parts[1] == stem[2:4]
    return len(parts) == 2 and bool(_HEX64.fullmatch(stem)) and bool(_HEX64.fullmatch(parts[0]))


def _hidden(relative: Path) -> bool:
    """A write in flight or a tool's own bookkeeping, never an entry nor a foreign file: hidden names
    cover ".tmp.XXXXXX" writes (and what a sync tool parks beside the entries, its metadata folder);
    a ".tmp." anywhere covers "<key>.neff.tmp.XXXXXX"-style names too."""
    return any(part.startswith(".") or ".tmp." in part for part in relative.parts)


def _is_finished(path: Path, cache_dir: Path) -> bool:
    relative = path.relative_to(cache_dir)
    if _hidden(relative):
        return False
    if not _in_torch_neuronx_layout(relative) or path.is_symlink():
        # A link could point anywhere on the runner; only files the compiler wrote are published.
        return False
    try:
        return path.is_file() and path.stat().st_size > 0
    except OSError:  # renamed or removed while we looked: not ours to publish
        return False


def finished_entries(cache_dir: Path) -> list[Path]:
    """The cache's complete entries (non-empty ``.neff`` files at a path torch-neuronx reads, no
    partial write), sorted."""
    if not cache_dir.is_dir():
        return []
    return sorted(path for path in cache_dir.rglob("*.neff") if _is_finished(path, cache_dir))


def _files(cache_dir: Path) -> dict[Path, tuple[int, int]]:
    """Every regular file under ``cache_dir`` (relative path -> size, mtime), links excluded."""
    found: dict[Path, tuple[int, int]] = {}
    if not cache_dir.is_dir():
        return found
    for path in cache_dir.rglob("*"):
        try:
            if path.is_symlink() or not path.is_file():
                continue
            stat = path.stat()
        except OSError:
            continue
        found[path.relative_to(cache_dir)] = (stat.st_size, stat.st_mtime_ns)
    return found


def _foreign_text(foreign: tuple[str, ...], shown: int = 5) -> str:
    more = f" (+{len(foreign) - shown} more)" if len(foreign) > shown else ""
    return (
        f"{len(foreign)} file(s) not in a layout torch-neuronx reads (ab/cd/<32-hex>.neff, "
        f"<sha256>/<sha256>.neff), which it will never load: {', '.join(foreign[:shown])}{more}"
    )


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


#: Where a user's sync command puts the cache (one folder per compiler under it), and where the
#: reproduction's run command points run.py at it: the viewer, ``runscript`` and the doctor say the same.
SYNC_BASE = "/tmp/neff_cache"


def sync_cache_dir(neuronx_cc: str) -> str:
    """Compiler ``neuronx_cc``'s own local cache under :data:`SYNC_BASE`, the folder a sweep's run.py and
    ``neff pull`` use (torch-neuronx's cache keys hold no compiler version)."""
    return str(local_cache_dir(Path(SYNC_BASE), neuronx_cc))


def sync_command(neuronx_cc: str) -> str | None:
    """The command that fetches the public NEFF cache for compiler ``neuronx_cc`` into its own local
    folder (:func:`sync_cache_dir`); None off Trainium (no compiler, ``none``) or for a recorded version
    no bucket folder can be named by."""
    try:
        return shlex.join(pull_command(neuronx_cc, sync_cache_dir(neuronx_cc)))
    except NeffCacheError:
        return None


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


def pull(version: str, base: Path, bucket: str = DEFAULT_BUCKET, hf: str = "hf") -> PullReport:
    """Sync compiler ``version``'s published graphs into its local cache, ``<base>/neuronxcc-<version>``
    (:func:`local_cache_dir`).

    Raises :class:`NothingCopied` (carrying the report) when the sync added or changed no entry
    torch-neuronx reads: a wrong version or bucket copies nothing and ``hf`` says nothing, and a bucket
    in another layout (libneuronxla's ``MODULE_*/model.neff``) copies files torch-neuronx never reads,
    so the caller must hear it. Foreign files that arrive beside usable entries are named in the
    report (:meth:`PullReport.describe`).
    """
    cache_dir = local_cache_dir(base, version)
    argv = pull_command(version, cache_dir, bucket)
    cache_dir.mkdir(parents=True, exist_ok=True)
    before, files_before = _snapshot(cache_dir), _files(cache_dir)
    _sync(argv, hf)
    after, files_after = _snapshot(cache_dir), _files(cache_dir)
    copied = sum(1 for path, seen in after.items() if before.get(path) != seen)
    foreign = tuple(
        sorted(
            str(path)
            for path, seen in files_after.items()
            if path not in after and files_before.get(path) != seen and not _hidden(path)
        )
    )
    report = PullReport(argv[3], cache_dir, len(before), len(after), copied, foreign)
    if copied == 0:
        if foreign:
            why = f"the sync brought only {_foreign_text(foreign)}: the bucket folder is not a torch-neuronx cache"
        elif report.after == 0:
            why = "the cache is still empty: the bucket has no entry for this compiler version, or the version is wrong"
        else:
            why = f"the cache already held all {report.after} entries, or the version or bucket is wrong"
        raise NothingCopied(f"copied nothing from {report.prefix} into {cache_dir}: {why}", report)
    return report


def _staging_parent(cache_dir: Path) -> str | None:
    # Beside the cache, hard links work (same filesystem); elsewhere stage() falls back to copies.
    parent = cache_dir.resolve().parent
    return str(parent) if os.access(parent, os.W_OK) else None


def push(version: str, base: Path, bucket: str = DEFAULT_BUCKET, hf: str = "hf", dry_run: bool = False) -> PushReport:
    """Publish the finished entries of compiler ``version``'s local cache (``<base>/neuronxcc-<version>``,
    :func:`local_cache_dir`) into its bucket folder; what another compiler's folder holds, or ``base``
    itself, is never staged.

    The entries are staged into a temporary folder first (:func:`stage`), so only finished entries
    are uploaded. A dry run stages and counts but does not run ``hf``. Raises :class:`NothingStaged`
    when the cache holds no finished entry, :class:`SyncFailed` when the sync fails. ``hf`` reads
    the token from the environment (``HF_TOKEN``); it never appears in the command.
    """
    prefix = bucket_prefix(version, bucket)
    cache_dir = local_cache_dir(base, version)
    with tempfile.TemporaryDirectory(prefix="neff-push-", dir=_staging_parent(cache_dir)) as tmp:
        staging = Path(tmp)
        argv = push_command(version, staging, bucket)
        staged = stage(cache_dir, staging)
        if staged == 0:
            raise NothingStaged(f"no finished NEFF entry under {cache_dir}: nothing to publish to {prefix}")
        if not dry_run:
            _sync(argv, hf)
    return PushReport(prefix, staged, tuple([hf, *argv[1:]]), ran=not dry_run)
