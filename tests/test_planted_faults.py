"""The planted-fault table (benchmarks/faults.py) stays well-formed, and the plumbing that plants it
(the sessions' conftest, the runscript check) works, without running a model."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_neuron_support import zoo
from pytest_neuron_support.devices import DEVICES
from pytest_neuron_support.runscript import RunSpec, render

# benchmarks/ is a directory of scripts, not a package: import from it as the benchmarks themselves do.
BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

import faults  # noqa: E402
import planted_faults  # noqa: E402


@pytest.mark.parametrize("kind", list(faults.FAULTS))
def test_every_kind_is_described_classified_and_compiles(kind: str) -> None:
    fault = faults.FAULTS[kind]
    assert fault.description.strip(), kind
    assert fault.expected in (faults.FAULT, faults.HEALTHY), kind
    assert fault.applies_to in faults.APPLIES_TO, kind
    compile(fault.source, kind, "exec")


def test_the_corpus_has_enough_faults_and_a_healthy_stand_in() -> None:
    expected = [fault.expected for fault in faults.FAULTS.values()]
    assert expected.count(faults.FAULT) >= 7
    assert expected.count(faults.HEALTHY) >= 1


def test_a_one_rank_fault_applies_to_sharded_entries_only() -> None:
    one_rank = [kind for kind, fault in faults.FAULTS.items() if 'os.environ.get("RANK")' in fault.source]
    assert one_rank, "no fault acts on one rank of a sharded run"
    for kind in one_rank:
        fault = faults.FAULTS[kind]
        assert fault.applies_to == faults.SHARDED, kind
        assert not faults.applies(fault, None) and not faults.applies(fault, 1), kind
        assert faults.applies(fault, 2) and faults.applies(fault, 4), kind


def test_the_sessions_conftest_returns_the_named_kinds_source(monkeypatch: pytest.MonkeyPatch) -> None:
    namespace: dict[str, object] = {}
    exec(compile(faults.conftest(str(BENCH)), "conftest.py", "exec"), namespace)
    hook = namespace["pytest_neuron_support_post_load"]
    assert callable(hook)
    sharded_kind = next(kind for kind, fault in faults.FAULTS.items() if fault.applies_to == faults.SHARDED)
    monkeypatch.setenv(faults.ENV_VAR, sharded_kind)
    assert hook(None, SimpleNamespace(cores=2)) == faults.FAULTS[sharded_kind].source
    assert hook(None, SimpleNamespace(cores=None)) is None  # not planted into a single-process entry
    monkeypatch.setenv(faults.ENV_VAR, "dead-layer")
    assert hook(None, SimpleNamespace(cores=None)) == faults.FAULTS["dead-layer"].source


def test_the_benchmark_reads_the_planted_source_back_from_run_py() -> None:
    source = faults.FAULTS["embedding-rows-swapped"].source
    spec = RunSpec(
        model="tiny-random/qwen3",
        revision="main",
        task="text-generation",
        dtype="bfloat16",
        prompt=zoo.TINY_PROMPT,
        max_new_tokens=32,
        device=DEVICES["cpu"],
        compile=True,
        compile_backend="inductor",
        post_load=source,
    )
    assert planted_faults.planted_source(render(spec)) == source


def test_the_benchmark_runs_the_generation_entries_only() -> None:
    entries = planted_faults.generation_entries()
    ids = [entry["id"] for entry in entries]
    assert "tiny-random/llava" in ids and "sentence-transformers/all-MiniLM-L6-v2" not in ids
    assert any((entry.get("cores") or 1) > 1 for entry in entries)  # the one-rank fault has entries to run on
