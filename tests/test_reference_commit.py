"""The reference cache keys on what was loaded (issue 39, item 3), and the teacher-forced check reuses the
reference's own scores only for the same tokens after the same prefix (item 6).

Sessions that move a real ``refs/main`` between runs sharing ``--reference-cache``: below, a catalog item's
teacher-forced check; in test_user_paths, a user's ``neuron_reference`` beside ``neuron_run``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from faultkit import assert_outcomes, catalog
from hubrefs import move_main, private_hub, snapshot

from pytest_neuron_support import zoo
from pytest_neuron_support.base.model import ModelSpec
from pytest_neuron_support.cpu.forced import forced_check
from pytest_neuron_support.data.records import current_stack
from pytest_neuron_support.devices.table import DEVICES
from pytest_neuron_support.planning.planner import Plan
from pytest_neuron_support.run.caches import ReferenceCache, cached_commit, hub_cache_dir
from pytest_neuron_support.run.context import Job
from pytest_neuron_support.run.settings import Settings
from pytest_neuron_support.tasks.table import task_of

#: A sharded run's CPU side is the teacher-forced check alone (no free-running reference to reuse).
SHARDED = "judge: {model: tiny-random/judge}\n" + catalog("tiny-random/llama").replace(
    "{id: tiny-random/llama,", "{id: tiny-random/llama, cores: 2,"
)


def test_the_hub_cache_resolves_a_revision_to_the_commit_of_its_snapshot(tmp_path: Path) -> None:
    files = tmp_path / "files"
    files.mkdir()
    (files / "config.json").write_text('{"model_type": "llama"}')
    cache = tmp_path / "hub"
    first = zoo.install_snapshot(cache, "org/model", files).name
    environ = {"HF_HUB_CACHE": str(cache)}
    assert cached_commit("org/model", "main", environ) == first
    assert cached_commit("org/model", first, environ) == first  # a commit is its own revision
    (files / "config.json").write_text('{"model_type": "llama", "moved": true}')
    second = zoo.install_snapshot(cache, "org/model", files).name
    assert second != first and cached_commit("org/model", "main", environ) == second
    # Not cached (yet), not a snapshot here, a local folder: no commit to name.
    assert cached_commit("org/other", "main", environ) is None
    assert cached_commit("org/model", "f" * 40, environ) is None
    assert cached_commit(str(files), "main", environ) is None
    # huggingface_hub's own order of the variables that name the cache.
    assert hub_cache_dir({"HF_HOME": "/h"}) == Path("/h/hub")
    assert hub_cache_dir({"HF_HUB_CACHE": "/c", "HF_HOME": "/h"}) == Path("/c")
    assert hub_cache_dir({"XDG_CACHE_HOME": "/x"}) == Path("/x/huggingface/hub")


def test_an_entry_of_no_commit_serves_only_a_local_folder(tmp_path: Path) -> None:
    cache = ReferenceCache(tmp_path)
    cache.put("k", {"ok": True, "tokens": [1], "commit": None})
    # A Hub model whose commit is unknown is not handed another run's result; a folder has none to know.
    assert cache.get("k", None) is None
    assert cache.get("k", None, local=True) == {"ok": True, "tokens": [1], "commit": None}
    cache.put("k", {"ok": True, "tokens": [1], "commit": "a" * 40})
    assert cache.get("k", "a" * 40) is not None and cache.get("k", "b" * 40) is None


def _job(tmp_path: Path) -> Job:
    settings = Settings(
        device=DEVICES["cpu"],
        neuron_cores=1,
        max_new_tokens=3,
        prompt="p",
        model_timeout=60.0,
        results_dir=tmp_path / "out",
        compile_backend="inductor",
        reference_dtype=None,
        allow_remote_code=False,
        stack=current_stack(),
        # Too little for any check to run here: what is not reused says so instead of running.
        cpu_check_memory_gib=1e-9,
    )
    return Job(
        ModelSpec("org/whisper", task="automatic-speech-recognition"), settings, Plan(1, 1, 1, "", None, 0), tmp_path
    )


def test_the_references_scores_are_reused_only_after_the_same_decoder_prompt(tmp_path: Path) -> None:
    job = _job(tmp_path)
    scored = [{"token": t, "top1": t, "rank": 0, "deficit": 0.0, "ids": [t], "logprobs": [0.0]} for t in (7, 8, 9)]
    english = [50258, 50259, 50360, 50364]  # start of transcript, <|en|>, transcribe, no timestamps
    reference = {"tokens": [7, 8, 9], "forced": scored, "prompt_tokens": 4, "decoder_prompt_ids": english}
    device = {"tokens": [7, 8, 9], "prompt_tokens": 4, "decoder_prompt_ids": english}
    check_spec = task_of("automatic-speech-recognition").run_spec(
        job.model, job.settings, device=DEVICES["cpu"], reference=True, post_load=""
    )
    same = forced_check(job, check_spec, device, 1000, reference)
    assert same.how == "reused" and same.forced is not None and same.forced.positions_disagreeing == 0
    # The device detected another language: the same tokens after <|de|> are other scores, so the
    # reference's pass (scored after <|en|>) is not the device's check.
    german = {**device, "decoder_prompt_ids": [50258, 50261, 50360, 50364]}
    other = forced_check(job, check_spec, german, 1000, reference)
    assert other.how.startswith("skipped: needs"), other.how
    # A longer prompt (another tokenization of it) is another prefix too.
    longer = forced_check(job, check_spec, {**device, "prompt_tokens": 5}, 1000, reference)
    assert longer.how.startswith("skipped: needs"), longer.how
    # Another snapshot's reference is another model's scores.
    moved = forced_check(job, check_spec, {**device, "commit": "b" * 40}, 1000, {**reference, "commit": "a" * 40})
    assert moved.how.startswith("skipped: needs"), moved.how


@pytest.mark.slow
@pytest.mark.usefixtures("eager_compile")
def test_a_moved_main_between_two_sessions_reruns_the_teacher_forced_check(
    pytester: pytest.Pytester, offline_hub: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub = private_hub(offline_hub, tmp_path / "hub", monkeypatch)
    pytester.makefile(".yaml", models=SHARDED)
    # One check cache for every session, as a user's ~/.cache is.
    cache = tmp_path / "checks"
    args = ("--device=cpu", "--neuron-cores=2", "--max-new-tokens=8", f"--reference-cache={cache}")

    def session(results: str) -> dict[str, object]:
        outcome = pytester.runpytest_subprocess(*args, f"--results-dir={results}", "-p", "no:cacheprovider")
        assert_outcomes(outcome, pytester.path / results, passed=1)
        [row] = pd.read_parquet(pytester.path / results / "data").to_dict("records")
        return dict(row)

    first = session("first")
    assert (first["verdict_basis"], first["cpu_check"]) == ("teacher-forced", "ran")
    [entry] = cache.glob("*.json")
    assert json.loads(entry.read_text())["commit"] == snapshot(hub, "tiny-random/llama").name
    # Same refs/main: the check's scores come from the cache.
    assert session("same")["cpu_check"] == "cached"
    # The Hub's main moved: the cached scores are the old snapshot's, so the check runs again, and its
    # entry is the new commit's.
    moved = move_main(hub, "tiny-random/llama", tmp_path / "pushed")
    after = session("moved")
    assert (after["result"], after["cpu_check"]) == ("PASS", "ran"), after["error"]
    assert json.loads(entry.read_text())["commit"] == moved
