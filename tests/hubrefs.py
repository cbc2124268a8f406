"""A Hugging Face cache of a test's own whose ``refs/main`` can move, as the Hub's ``main`` does when a
model's owner pushes: the sessions a test starts load the new snapshot, offline, as a user's would after
their next download."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pytest_neuron_support import zoo


def private_hub(zoo_cache: Path, into: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of ``zoo_cache`` at ``into`` (links kept, so the snapshots still point into its blobs), named
    by HF_HUB_CACHE for every process the test starts: moving a ref there leaves the shared zoo alone."""
    shutil.copytree(zoo_cache, into, symlinks=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(into))
    return into


def snapshot(cache: Path, repo_id: str) -> Path:
    """The snapshot ``refs/main`` of ``repo_id`` points at."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    return repo / "snapshots" / (repo / "refs" / "main").read_text().strip()


def move_main(cache: Path, repo_id: str, staging: Path) -> str:
    """Point ``refs/main`` of ``repo_id`` at a new snapshot: its files with the model card edited, as a
    push that touches no weight still makes a new commit. Returns the new commit."""
    old = snapshot(cache, repo_id)
    shutil.copytree(old, staging)  # the links' targets, as plain files
    card = staging / "README.md"
    card.write_text((card.read_text() if card.exists() else "") + "\nA later commit.\n")
    new = zoo.install_snapshot(cache, repo_id, staging).name
    assert new != old.name
    return new
