"""Publishing and pulling the NEFF cache: real cache folders on disk, and a real ``hf`` executable.

The stand-in ``hf`` is a script on PATH that records its argv (and whether it saw a token, never the
token) and, for ``buckets sync SRC DST``, copies SRC to DST, a bucket being a folder under a local
root. So pull / push run a real subprocess exactly as they run the real CLI on a trn2 host.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_neuron_support import neffcache, viewer

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


def cache_with_partials(cache: Path, outside: Path) -> list[Path]:
    """A cache as torch-neuronx leaves it mid-compile; returns its finished entries."""
    finished = [write(cache / "ab" / "cd" / "abcd1234.neff"), write(cache / "12" / "34" / "1234beef.neff")]
    write(cache / "ab" / "cd" / ".tmp.abc123")  # a write in flight
    write(cache / "ab" / "cd" / "abcd5678.neff.tmp.abc123")
    write(cache / "ab" / "cd" / ".tmp.def456.neff")
    write(cache / "ab" / "ef" / "abef0000.neff", b"")  # created, never written
    write(cache / ".tmp.dir" / "ab" / "abab0000.neff")  # inside a hidden (temporary) folder
    write(cache / "ab" / "cd" / "abcd1234.neff.lock")
    write(cache / "locks" / "abcd1234.lock")
    write(outside / "secret.neff", b"not the compiler's")
    (cache / "ab" / "link.neff").symlink_to(outside / "secret.neff")
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
    # The viewer's copy-paste command is the same pull.
    assert viewer.neff_sync_command(VERSION) == (
        f"hf buckets sync hf://buckets/aws-neuron/torch-neuronx-neff-cache/neuronxcc-{VERSION} /tmp/neff_cache"
    )
    assert viewer.neff_sync_command("none") is None


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
    assert neffcache.stage(cache, staging) == 2
    staged = sorted(p for p in staging.rglob("*") if not p.is_dir())
    assert [p.relative_to(staging) for p in staged] == [p.relative_to(cache) for p in finished]
    for entry in finished:
        copy = staging / entry.relative_to(cache)
        assert copy.read_bytes() == entry.read_bytes()
        assert os.path.samefile(copy, entry)  # a hard link on one filesystem: nothing copied
    with pytest.raises(neffcache.NeffCacheError, match="not empty"):
        neffcache.stage(cache, staging)  # whatever a staging folder holds would be published


def test_pull_syncs_the_compiler_folder_and_counts_what_it_copied(hf: Hf, tmp_path: Path) -> None:
    write(hf.folder() / "ab" / "cd" / "abcd1234.neff")
    write(hf.folder() / "ef" / "01" / "ef012345.neff")
    cache = tmp_path / "cache"
    write(cache / "99" / "99" / "local.neff")  # compiled here, never published: a pull keeps it
    report = neffcache.pull(VERSION, cache, BUCKET, hf=str(hf.path))
    assert (report.before, report.after, report.copied) == (1, 3, 2)
    assert report.prefix == f"{BUCKET}/neuronxcc-{VERSION}"
    assert (cache / "ab" / "cd" / "abcd1234.neff").is_file() and (cache / "99" / "99" / "local.neff").is_file()
    assert hf.calls() == [{"argv": ["buckets", "sync", report.prefix, str(cache)], "token": False}]


def test_a_pull_that_copies_nothing_says_so(hf: Hf, tmp_path: Path) -> None:
    write(hf.folder() / "ab" / "cd" / "abcd1234.neff")
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
    assert (
        f"pulled 1 entries from {BUCKET}/neuronxcc-{VERSION} into {tmp_path / 'env'} (it held 0, now 1)" in done.stdout
    )
    with pytest.raises(neffcache.SyncFailed, match="not found"):
        neffcache.pull(VERSION, cache, BUCKET, hf=str(tmp_path / "no-hf-here"))


def test_push_publishes_only_finished_entries(hf: Hf, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    finished = cache_with_partials(cache, tmp_path / "elsewhere")
    report = neffcache.push(VERSION, cache, BUCKET, hf=str(hf.path))
    assert (report.staged, report.ran, report.prefix) == (2, True, f"{BUCKET}/neuronxcc-{VERSION}")
    published = sorted(p.relative_to(hf.folder()) for p in hf.folder().rglob("*") if p.is_file())
    assert published == [p.relative_to(cache) for p in finished]
    (call,) = hf.calls()
    assert call["argv"] == list(report.command[1:])
    assert not Path(report.command[3]).exists()  # the staging folder is gone
    with pytest.raises(neffcache.NothingStaged, match="nothing to publish"):
        neffcache.push(VERSION, tmp_path / "empty-cache", BUCKET, hf=str(hf.path))


def test_cli_push_needs_a_token_never_shows_it_and_dry_runs(hf: Hf, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache_with_partials(cache, tmp_path / "elsewhere")
    common = ("--cache", str(cache), "--version", VERSION, "--bucket", BUCKET)

    refused = hf.cli("push", *common)
    assert refused.returncode == 2 and "HF_TOKEN is not set" in refused.stderr
    assert hf.calls() == []  # hf never ran

    dry = hf.cli("push", *common, "--dry-run", token=TOKEN)
    assert dry.returncode == 0, dry.stderr
    assert f"would run (staging folder is temporary): hf buckets sync {tmp_path}/neff-push-" in dry.stdout
    assert dry.stdout.rstrip().endswith(f"2 finished entries staged from {cache} for {BUCKET}/neuronxcc-{VERSION}")
    assert hf.calls() == []

    done = hf.cli("push", *common, token=TOKEN)
    assert done.returncode == 0, done.stderr
    assert f"published 2 finished entries from {cache} to {BUCKET}/neuronxcc-{VERSION}" in done.stdout
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
