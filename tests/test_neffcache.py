"""Publishing and pulling the NEFF cache: real cache folders on disk, and a real ``hf`` executable.

The stand-in ``hf`` is a script on PATH that records its argv (and whether it saw a token, never the
token) and, for ``buckets sync SRC DST``, copies SRC to DST, a bucket being a folder under a local
root. So pull / push run a real subprocess exactly as they run the real CLI on a trn2 host.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_neuron_support.run import neffcache

VERSION = "2.15.128.0+56dc5a86"
BUCKET = "hf://buckets/test-org/neff-cache"
TOKEN = "hf_standin_secret_0123456789"

STANDIN = """#!{python}
import json, os, shutil, sys
from pathlib import Path

ROOT = Path({root!r})
with open({log!r}, "a") as log:
    log.write(json.dumps({{"argv": sys.argv[1:], "token": bool(os.environ.get("HF_TOKEN"))}}) + "\\n")


def local(path):
    prefix = "hf://buckets/"
    return ROOT / path[len(prefix):] if path.startswith(prefix) else Path(path)


if sys.argv[1:3] == ["buckets", "sync"]:
    src, dst = local(sys.argv[3]), local(sys.argv[4])
    copied = 0
    if src.is_dir():  # like hf: a bucket folder that does not exist copies nothing, silently
        for path in src.rglob("*"):
            if path.is_file():
                target = dst / path.relative_to(src)
                target.parent.mkdir(parents=True, exist_ok=True)
                if not target.exists() or target.stat().st_mtime_ns != path.stat().st_mtime_ns:
                    shutil.copy2(path, target)
                    copied += 1
    print(f"synced {{copied}} files")
    sys.exit(0)
sys.exit(2)
"""


class Hf:
    """The stand-in: where its buckets live and what it was asked to do."""

    def __init__(self, tmp: Path) -> None:
        self.bin = tmp / "bin"
        self.bin.mkdir()
        self.buckets = tmp / "buckets"
        self.log = tmp / "hf-calls.jsonl"
        self.path = self.bin / "hf"
        self.path.write_text(STANDIN.format(python=sys.executable, root=str(self.buckets), log=str(self.log)))
        self.path.chmod(0o755)

    def folder(self, version: str = VERSION) -> Path:
        """The local folder behind ``BUCKET``'s folder for ``version``."""
        return self.buckets / "test-org" / "neff-cache" / f"neuronxcc-{version}"

    def calls(self) -> list[dict[str, object]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def cli(self, *args: str, token: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
        environ = {
            key: value for key, value in os.environ.items() if key not in ("HF_TOKEN", "TORCH_NEURONX_NEFF_CACHE_DIR")
        }
        environ["PATH"] = f"{self.bin}{os.pathsep}{environ.get('PATH', '')}"
        if token is not None:
            environ["HF_TOKEN"] = token
        environ.update(env)
        return subprocess.run(
            [sys.executable, "-m", "pytest_neuron_support.cli", "neff", *args],
            capture_output=True,
            text=True,
            check=False,
            env=environ,
        )


@pytest.fixture
def hf(tmp_path: Path) -> Hf:
    return Hf(tmp_path)


def write(path: Path, data: bytes = b"NEFF\x00graph") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def key(seed: str) -> str:
    """A C++ compilation-cache key as torch-neuronx spells it: 32 hex digits."""
    return hashlib.md5(seed.encode()).hexdigest()


def entry(cache: Path, seed: str) -> Path:
    """Where torch-neuronx's C++ cache keeps ``seed``'s NEFF: ``<dir>/ab/cd/<key>.neff``."""
    k = key(seed)
    return cache / k[:2] / k[2:4] / f"{k}.neff"


def kernel_entry(cache: Path, seed: str) -> Path:
    """Where its Python kernels keep one: ``<dir>/<sha256>/<sha256>.neff``."""
    digest = hashlib.sha256(seed.encode()).hexdigest()
    return cache / digest / f"{digest}.neff"


def cache_with_partials(cache: Path, outside: Path) -> list[Path]:
    """A cache as torch-neuronx leaves it mid-compile; returns its finished entries."""
    finished = [write(entry(cache, "one")), write(entry(cache, "two")), write(kernel_entry(cache, "kernel"))]
    first = entry(cache, "one")
    write(first.parent / ".tmp.abc123")  # a write in flight
    write(first.with_name(first.name + ".tmp.abc123"))
    write(first.parent / ".tmp.def456.neff")
    write(entry(cache, "never-written"), b"")  # created, never written: torch-neuronx reads it as a miss
    write(cache / ".tmp.dir" / entry(cache, "hidden").relative_to(cache))  # inside a hidden (temporary) folder
    write(first.with_name(first.name + ".lock"))
    write(cache / "locks" / "abcd1234.lock")
    write(cache / "ab" / "cd" / "abcd1234.neff")  # not a 32-hex key: not a path torch-neuronx looks up
    k = key("misplaced")
    write(cache / "00" / "00" / f"{k}.neff")  # a real key under the wrong shard folders
    write(cache / "MODULE_0123456789abcdef" / "model.neff")  # libneuronxla's layout
    write(outside / "secret.neff", b"not the compiler's")
    (first.parent / "link.neff").symlink_to(outside / "secret.neff")
    return sorted(finished)


def test_prefix_names_the_compiler_folder_with_its_local_label() -> None:
    assert neffcache.bucket_prefix(VERSION) == f"hf://buckets/aws-neuron/torch-neuronx-neff-cache/neuronxcc-{VERSION}"
    assert neffcache.bucket_prefix("2.21.33", BUCKET + "/") == f"{BUCKET}/neuronxcc-2.21.33"
    assert neffcache.pull_command(VERSION, "/tmp/neff_cache") == [
        "hf",
        "buckets",
        "sync",
        f"hf://buckets/aws-neuron/torch-neuronx-neff-cache/neuronxcc-{VERSION}",
        "/tmp/neff_cache",
    ]
    assert neffcache.push_command(VERSION, Path("/stage"), BUCKET) == [
        "hf",
        "buckets",
        "sync",
        "/stage",
        f"{BUCKET}/neuronxcc-{VERSION}",
    ]
    # The viewer's copy-paste command is the same pull, into the compiler's own folder.
    assert neffcache.sync_command(VERSION) == (
        f"hf buckets sync hf://buckets/aws-neuron/torch-neuronx-neff-cache/neuronxcc-{VERSION}"
        f" /tmp/neff_cache/neuronxcc-{VERSION}"
    )
    assert neffcache.sync_command("none") is None


def test_prefix_refuses_none_and_what_is_not_a_version() -> None:
    with pytest.raises(neffcache.NeffCacheError, match="neuronx-cc is not installed"):
        neffcache.bucket_prefix("none")
    with pytest.raises(neffcache.NeffCacheError, match="neuronx-cc is not installed"):
        neffcache.bucket_prefix("")
    for bad in ("../2.15.0", "2.15.0/../../x", "2.15 0", "latest"):
        with pytest.raises(neffcache.NeffCacheError, match="not a compiler version"):
            neffcache.bucket_prefix(bad)
    for bucket in ("s3://somewhere", "hf://buckets/", "/tmp/bucket"):
        with pytest.raises(neffcache.NeffCacheError, match="not a bucket"):
            neffcache.bucket_prefix(VERSION, bucket)


def test_finished_entries_are_non_empty_neff_files_only(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    finished = cache_with_partials(cache, tmp_path / "elsewhere")
    assert neffcache.finished_entries(cache) == finished
    assert neffcache.finished_entries(tmp_path / "absent") == []


def test_stage_links_finished_entries_keeping_relative_paths(tmp_path: Path) -> None:
    cache, staging = tmp_path / "cache", tmp_path / "staging"
    finished = cache_with_partials(cache, tmp_path / "elsewhere")
    assert neffcache.stage(cache, staging) == 3
    staged = sorted(p for p in staging.rglob("*") if not p.is_dir())
    assert [p.relative_to(staging) for p in staged] == [p.relative_to(cache) for p in finished]
    for found in finished:
        copy = staging / found.relative_to(cache)
        assert copy.read_bytes() == found.read_bytes()
        assert os.path.samefile(copy, found)  # a hard link on one filesystem: nothing copied
    with pytest.raises(neffcache.NeffCacheError, match="not empty"):
        neffcache.stage(cache, staging)  # whatever a staging folder holds would be published


def test_each_compiler_version_has_its_own_local_cache_which_runs_pull_and_push_share(tmp_path: Path) -> None:
    from pytest_neuron_support.devices.table import DEVICES

    base = tmp_path / "neff"
    a, b = neffcache.local_cache_dir(base, "2.15.128.0+56dc5a86"), neffcache.local_cache_dir(base, "2.16.0.0+1a2b3c4d")
    assert a == base / "neuronxcc-2.15.128.0+56dc5a86" and b == base / "neuronxcc-2.16.0.0+1a2b3c4d"
    # The runs get the same folder (torch-neuronx's keys hold no compiler version); inductor's do, so
    # cpu and cuda runs keep the directory they were given.
    assert neffcache.run_cache_dir(DEVICES["neuron"], base, "2.16.0.0+1a2b3c4d") == b
    assert neffcache.run_cache_dir(DEVICES["neuron"], base, "none") == base / "neuronxcc-unknown"
    assert neffcache.run_cache_dir(DEVICES["cpu"], base, "none") == base
    assert neffcache.run_cache_dir(DEVICES["cuda"], base, "2.16.0.0+1a2b3c4d") == base
    with pytest.raises(neffcache.NeffCacheError, match="not a compiler version"):
        neffcache.local_cache_dir(base, "../2.15.0")


def test_pull_syncs_the_compiler_folder_into_its_local_cache_and_counts_what_it_copied(hf: Hf, tmp_path: Path) -> None:
    write(entry(hf.folder(), "one"))
    write(kernel_entry(hf.folder(), "kernel"))
    base = tmp_path / "cache"
    cache = neffcache.local_cache_dir(base, VERSION)
    write(entry(cache, "local"))  # compiled here, never published: a pull keeps it
    write(entry(base, "flat"))  # an unversioned cache from before: not this compiler's, not counted
    report = neffcache.pull(VERSION, base, BUCKET, hf=str(hf.path))
    assert (report.before, report.after, report.copied, report.foreign) == (1, 3, 2, ())
    assert report.prefix == f"{BUCKET}/neuronxcc-{VERSION}" and report.cache_dir == cache
    assert entry(cache, "one").is_file() and entry(cache, "local").is_file()
    assert hf.calls() == [{"argv": ["buckets", "sync", report.prefix, str(cache)], "token": False}]


def test_a_pull_of_a_bucket_in_another_layout_names_what_torch_neuronx_would_never_read(hf: Hf, tmp_path: Path) -> None:
    # The issue: any *.neff at any depth counted, so libneuronxla's MODULE_*/model.neff "pulled".
    write(hf.folder() / "MODULE_8a1f2b3c4d5e6f70+4fe2a1b7" / "model.neff")
    write(hf.folder() / "MODULE_8a1f2b3c4d5e6f70+4fe2a1b7" / "model.done", b"")
    write(hf.folder() / "ab" / "cd" / "abcd1234.neff")  # sharded, but no 32-hex key
    # A sync tool's own bookkeeping beside the entries is neither an entry nor a foreign file.
    write(hf.folder() / ".cache" / "huggingface" / "sync" / "state.metadata")
    base = tmp_path / "cache"
    with pytest.raises(neffcache.NothingCopied, match="not a torch-neuronx cache") as foreign:
        neffcache.pull(VERSION, base, BUCKET, hf=str(hf.path))
    report = foreign.value.report
    assert (report.after, report.copied) == (0, 0)
    assert report.foreign == (
        "MODULE_8a1f2b3c4d5e6f70+4fe2a1b7/model.done",
        "MODULE_8a1f2b3c4d5e6f70+4fe2a1b7/model.neff",
        "ab/cd/abcd1234.neff",
    )
    assert "3 file(s) not in a layout torch-neuronx reads" in str(foreign.value)
    # Usable entries beside foreign files: the pull succeeds and names the foreign ones.
    write(entry(hf.folder(), "one"))
    report = neffcache.pull(VERSION, base, BUCKET, hf=str(hf.path))
    assert (report.copied, report.foreign) == (1, ())  # the foreign files arrived last time, unchanged since
    write(hf.folder() / "MODULE_ffff" / "model.neff")
    write(entry(hf.folder(), "two"))
    report = neffcache.pull(VERSION, base, BUCKET, hf=str(hf.path))
    assert (report.copied, report.foreign) == (1, ("MODULE_ffff/model.neff",))
    assert "1 file(s) not in a layout torch-neuronx reads" in report.describe()


def test_a_pull_that_copies_nothing_says_so(hf: Hf, tmp_path: Path) -> None:
    write(entry(hf.folder(), "one"))
    cache = tmp_path / "cache"
    # The distribution's version lacks the local label: a folder that does not exist, and hf is silent.
    with pytest.raises(neffcache.NothingCopied, match=r"copied nothing .* the cache is still empty") as empty:
        neffcache.pull("2.15.128.0", cache, BUCKET, hf=str(hf.path))
    assert (empty.value.report.before, empty.value.report.after) == (0, 0)
    neffcache.pull(VERSION, cache, BUCKET, hf=str(hf.path))
    with pytest.raises(neffcache.NothingCopied, match="already held all 1 entries"):
        neffcache.pull(VERSION, cache, BUCKET, hf=str(hf.path))

    done = hf.cli("pull", "--cache", str(tmp_path / "other"), "--version", "2.15.128.0", "--bucket", BUCKET)
    assert done.returncode == 1
    assert "copied nothing from hf://buckets/test-org/neff-cache/neuronxcc-2.15.128.0" in done.stderr
    done = hf.cli("pull", "--version", VERSION, "--bucket", BUCKET, TORCH_NEURONX_NEFF_CACHE_DIR=str(tmp_path / "env"))
    assert done.returncode == 0, done.stderr
    assert f"pulled 1 entries from {BUCKET}/neuronxcc-{VERSION} into {tmp_path / 'env'}" in done.stdout
    assert entry(neffcache.local_cache_dir(tmp_path / "env", VERSION), "one").is_file()
    with pytest.raises(neffcache.SyncFailed, match="not found"):
        neffcache.pull(VERSION, cache, BUCKET, hf=str(tmp_path / "no-hf-here"))


def test_push_publishes_only_finished_entries_of_its_own_compiler(hf: Hf, tmp_path: Path) -> None:
    base = tmp_path / "cache"
    cache = neffcache.local_cache_dir(base, VERSION)
    finished = cache_with_partials(cache, tmp_path / "elsewhere")
    # The issue: one fixed directory for every compiler, so a push after an upgrade published NEFFs the
    # old compiler built under the new compiler's folder. Version A's and the flat cache's stay here.
    older = neffcache.local_cache_dir(base, "2.14.0.0+00aa11bb")
    write(entry(older, "built-by-the-old-compiler"))
    write(entry(base, "flat-from-before"))
    report = neffcache.push(VERSION, base, BUCKET, hf=str(hf.path))
    assert (report.staged, report.ran, report.prefix) == (3, True, f"{BUCKET}/neuronxcc-{VERSION}")
    published = sorted(p.relative_to(hf.folder()) for p in hf.folder().rglob("*") if p.is_file())
    assert published == [p.relative_to(cache) for p in finished]
    (call,) = hf.calls()
    assert call["argv"] == list(report.command[1:])
    assert not Path(report.command[3]).exists()  # the staging folder is gone
    with pytest.raises(neffcache.NothingStaged, match="nothing to publish"):
        neffcache.push(VERSION, tmp_path / "empty-cache", BUCKET, hf=str(hf.path))
    with pytest.raises(neffcache.NothingStaged, match="nothing to publish"):
        neffcache.push("2.16.0.0+1a2b3c4d", base, BUCKET, hf=str(hf.path))  # B never stages A's


def test_cli_push_needs_a_token_never_shows_it_and_dry_runs(hf: Hf, tmp_path: Path) -> None:
    base = tmp_path / "cache"
    cache_with_partials(neffcache.local_cache_dir(base, VERSION), tmp_path / "elsewhere")
    common = ("--cache", str(base), "--version", VERSION, "--bucket", BUCKET)

    refused = hf.cli("push", *common)
    assert refused.returncode == 2 and "HF_TOKEN is not set" in refused.stderr
    assert hf.calls() == []  # hf never ran

    dry = hf.cli("push", *common, "--dry-run", token=TOKEN)
    assert dry.returncode == 0, dry.stderr
    assert f"would run (staging folder is temporary): hf buckets sync {base}/neff-push-" in dry.stdout
    assert dry.stdout.rstrip().endswith(f"3 finished entries staged from {base} for {BUCKET}/neuronxcc-{VERSION}")
    assert hf.calls() == []

    done = hf.cli("push", *common, token=TOKEN)
    assert done.returncode == 0, done.stderr
    assert f"published 3 finished entries from {base} to {BUCKET}/neuronxcc-{VERSION}" in done.stdout
    assert [call["token"] for call in hf.calls()] == [True]  # hf got the token, from the environment
    for output in (refused, dry, done):
        assert TOKEN not in output.stdout + output.stderr


def test_cli_refuses_to_guess_a_version_off_trainium(hf: Hf, tmp_path: Path) -> None:
    # No neuronx-cc here: devices.compiler_version says "none", and no bucket folder is named for it.
    for command in ("pull", "push"):
        done = hf.cli(command, "--cache", str(tmp_path), token=TOKEN)
        assert done.returncode == 2
        assert f"neuron-support neff {command}: no neuronx-cc version ('none')" in done.stderr
    assert hf.calls() == []


def test_a_neuron_session_without_neff_cache_uses_the_base_neff_pull_fills() -> None:
    # Without --neff-cache a neuron run would compile into torch-neuronx's flat default while neff pull
    # filled <base>/neuronxcc-<version>: the session takes the same default base the pull and push do.
    from pytest_neuron_support.devices.table import DEVICES
    from pytest_neuron_support.run.neffcache import DEFAULT_CACHE_DIR, session_cache_base

    neuron, cpu = DEVICES["neuron"], DEVICES["cpu"]
    assert session_cache_base(neuron, None, {}) == Path(DEFAULT_CACHE_DIR)
    assert session_cache_base(neuron, None, {"TORCH_NEURONX_NEFF_CACHE_DIR": "/c"}) == Path("/c")
    assert session_cache_base(neuron, Path("/given"), {"TORCH_NEURONX_NEFF_CACHE_DIR": "/c"}) == Path("/given")
    assert session_cache_base(cpu, None, {"TORCHINDUCTOR_CACHE_DIR": "/i"}) is None  # inductor keeps its own
    assert session_cache_base(cpu, Path("/given"), {}) == Path("/given")
