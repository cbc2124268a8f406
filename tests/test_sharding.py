from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from pytest_neuron_support.data.records import COLUMN_DOCS, Row, current_stack
from pytest_neuron_support.devices.table import DEVICES
from pytest_neuron_support.run.caches import ReferenceCache, clean_compile_cache, reference_key
from pytest_neuron_support.run.runscript import RunSpec
from pytest_neuron_support.session.sharding import Shard, ShardError, assign, parse_shard, shard_from_env
from pytest_neuron_support.tasks.table import task_of


def test_parse_shard() -> None:
    assert parse_shard("1/4") == Shard(1, 4, "--shard")
    for bad in ("4/4", "a/b", "1", "-1/2", "0/0"):
        with pytest.raises(ShardError, match="--shard"):
            parse_shard(bad)


def test_shard_from_scheduler_environments() -> None:
    assert shard_from_env({}) is None
    slurm = {"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_MIN": "1"}
    assert shard_from_env(slurm) == Shard(2, 3, "SLURM_ARRAY_TASK_ID")
    k8s = {"JOB_COMPLETION_INDEX": "0", "NEURON_SUPPORT_SHARDS": "2"}
    assert shard_from_env(k8s) == Shard(0, 2, "JOB_COMPLETION_INDEX")
    with pytest.raises(ShardError, match="NEURON_SUPPORT_SHARDS"):
        shard_from_env({"JOB_COMPLETION_INDEX": "0"})


def test_assignment_covers_every_item_once_and_balances_cost() -> None:
    costs = [(f"m{i}", float(c)) for i, c in enumerate([100, 90, 50, 40, 30, 20, 10, 5, 5, 1])]
    owner = assign(costs, 3)
    assert set(owner) == {name for name, _ in costs}
    loads = [sum(c for n, c in costs if owner[n] == s) for s in range(3)]
    assert max(loads) - min(loads) <= 30  # LPT: within the largest remaining item
    assert assign(list(reversed(costs)), 3) == owner  # input order does not matter


def spec(prompt: str = "p") -> RunSpec:
    return RunSpec(
        model="org/m",
        revision="main",
        task="text-generation",
        dtype="bfloat16",
        prompt=prompt,
        max_new_tokens=32,
        device=DEVICES["cpu"],
        compile=False,
        compile_backend="inductor",
    )


def test_reference_cache_is_keyed_by_settings_and_checked_against_the_commit(tmp_path: Path) -> None:
    stack = current_stack()
    cache = ReferenceCache(tmp_path)
    key = reference_key(spec(), stack)
    assert key != reference_key(spec("other prompt"), stack)
    assert cache.get(key, "abc") is None
    cache.put(key, {"ok": True, "tokens": [1, 2], "commit": "abc"})
    assert cache.get(key, "abc") == {"ok": True, "tokens": [1, 2], "commit": "abc"}
    assert cache.get(key, "def") is None  # the branch moved: not a hit


def test_compile_cache_cleaning_removes_what_a_dead_writer_left_in_the_neff_layout(tmp_path: Path) -> None:
    # torch-neuronx's on-disk layout: <dir>/ab/cd/<key>.neff, written through .tmp.XXXXXX files.
    entries = tmp_path / "ab" / "cd"
    entries.mkdir(parents=True)
    done = entries / "abcd1234.neff"
    done.write_bytes(b"neff")
    empty = entries / "abcd5678.neff"
    empty.touch()
    dead = entries / ".tmp.Xy12Ab"
    dead.write_bytes(b"half a neff")
    os.utime(dead, (time.time() - 7200, time.time() - 7200))
    writing = entries / ".tmp.Qw34Er"  # a live writer's, touched just now
    writing.write_bytes(b"being written")
    other = tmp_path / "notes.txt"
    other.write_text("not ours to judge")
    removed = clean_compile_cache(tmp_path)
    assert set(removed) == {empty, dead}
    assert done.exists() and writing.exists() and other.exists()
    assert not empty.exists() and not dead.exists()
    assert clean_compile_cache(tmp_path / "missing") == []


def row() -> Row:
    return Row(model_id="m", result="PASS", library_version="5.24.0", torch="2.13.0")


def test_missing_cache_stats_are_unknown_in_the_row_never_zero() -> None:
    # run.py's result when the wheel has no stats binding (templates/run.py cache_counts()).
    missing = {"compile_cache": {"hits": None, "misses": None, "unavailable": "AttributeError: no _get_..."}}
    counts = task_of("text-generation").with_result  # the task's result columns hold the counters
    unknown = counts(row(), missing)
    assert (unknown.persistent_cache_hits, unknown.persistent_cache_misses) == (None, None)
    counted = counts(row(), {"compile_cache": {"hits": 3, "misses": 0}})
    assert (counted.persistent_cache_hits, counted.persistent_cache_misses) == (3, 0)


def test_the_cache_counters_are_named_and_documented_for_what_each_device_counts() -> None:
    # The issue: compile_cache_hits/misses said "compiled graphs", but on neuron they count every kernel
    # that passes the persistent cache, the eager prefill's ops included.
    assert "compile_cache_hits" not in COLUMN_DOCS and "compile_cache_misses" not in COLUMN_DOCS
    hits = COLUMN_DOCS["persistent_cache_hits"]
    assert "eager prefill" in hits and "FX-graph" in hits and "_get_compilation_cache_stats" in hits
    assert "unknown, not zero" in COLUMN_DOCS["persistent_cache_misses"]
    # Datasets written before the rename keep their counts.
    before = {k: v for k, v in row().__dict__.items() if not k.startswith("persistent_cache_")}
    old = Row.from_mapping({**before, "compile_cache_hits": 5, "compile_cache_misses": 1})
    assert (old.persistent_cache_hits, old.persistent_cache_misses) == (5, 1)
