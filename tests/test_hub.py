"""The Hub rankings module against the loopback Hub: the real client, a real HTTP server, no mocks.

``huggingface_hub`` is already imported when these tests run (conftest imports the zoo, which
imports it), so setting ``HF_ENDPOINT`` with monkeypatch here also proves that
:func:`pytest_neuron_support.hub.fetch_ranking` honours the variable when it is set after import.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hubserver import HubServer, ModelRecord

from pytest_neuron_support import hub
from pytest_neuron_support.tasks.table import RANKED_TASKS, TASKS

CANARY = "hf_CanaryTokenDoNotLeak0123456789"
# Allowance on top of a deadline before a timing assertion fails: CI machines can be loaded.
SLACK_S = 5.0

MODELS = [
    ModelRecord(
        "meta/llama-tiny",
        downloads=900,
        likes=40,
        trending_score=12,
        pipeline_tag="text-generation",
        gated="manual",
        tags=("transformers", "text-generation"),
        created_at="2024-07-01T10:00:00.000Z",
        tensors={"embed.weight": ("BF16", (320, 64)), "norm.weight": ("F32", (64,))},
    ),
    ModelRecord(
        "qwen/qwen-tiny",
        downloads=5000,
        likes=100,
        trending_score=3.5,
        pipeline_tag="text-generation",
        shards=2,
        tensors={
            "a.weight": ("BF16", (1024, 512)),
            "b.weight": ("BF16", (512, 512)),
            "c.bias": ("F32", (512,)),
        },
        files={"config.json": b'{"model_type": "qwen2"}'},
    ),
    ModelRecord("org/plain-gen", downloads=10, likes=1, trending_score=30, pipeline_tag="text-generation"),
    ModelRecord("org/unscored-gen", downloads=1, trending_score=None, pipeline_tag="text-generation"),
    ModelRecord("google/vlm-tiny", downloads=700, trending_score=8, pipeline_tag="image-text-to-text"),
    ModelRecord("hf/vlm-other", downloads=7000, trending_score=2, pipeline_tag="image-text-to-text"),
    ModelRecord("openai/whisper-tiny", downloads=10**6, trending_score=99, pipeline_tag="automatic-speech-recognition"),
    ModelRecord("google/flan-t5", downloads=8000, trending_score=14, pipeline_tag="text2text-generation"),
    ModelRecord(
        "sd/tiny-diffusion", downloads=300, trending_score=40, pipeline_tag="text-to-image", library_name="diffusers"
    ),
    ModelRecord(
        "sentence-transformers/all-MiniLM-L6-v2",
        downloads=9 * 10**7,
        trending_score=50,
        pipeline_tag="sentence-similarity",
        library_name="sentence-transformers",
    ),
    ModelRecord("org/mpnet-embed", downloads=5000, trending_score=70, pipeline_tag="sentence-similarity"),
    ModelRecord("org/bge-features", downloads=800, trending_score=5, pipeline_tag="feature-extraction"),
    # The forward tasks' leaders: one each.
    ModelRecord("distilbert/sst2", downloads=6000, trending_score=12, pipeline_tag="text-classification"),
    ModelRecord("facebook/mnli", downloads=5000, trending_score=8, pipeline_tag="zero-shot-classification"),
    ModelRecord("dslim/ner", downloads=3000, trending_score=9, pipeline_tag="token-classification"),
    ModelRecord("google-bert/base", downloads=9000, trending_score=15, pipeline_tag="fill-mask"),
    ModelRecord("google/vit", downloads=4000, trending_score=7, pipeline_tag="image-classification"),
    ModelRecord("superb/ks", downloads=900, trending_score=3, pipeline_tag="audio-classification"),
    ModelRecord("openai/clip", downloads=7000, trending_score=13, pipeline_tag="zero-shot-image-classification"),
    ModelRecord("facebook/dinov2", downloads=2500, trending_score=6, pipeline_tag="image-feature-extraction"),
    ModelRecord("depth/anything", downloads=1200, trending_score=11, pipeline_tag="depth-estimation"),
    ModelRecord("hustvl/yolos", downloads=1500, trending_score=4, pipeline_tag="object-detection"),
    ModelRecord("nvidia/segformer", downloads=1800, trending_score=5, pipeline_tag="image-segmentation"),
    ModelRecord(
        "secret/private-gen", downloads=10**7, trending_score=1000, pipeline_tag="text-generation", private=True
    ),
]


def expected_order(task: str, key: str) -> list[str]:
    """What the Hub would list anonymously: public models of ``task``, best first."""
    public = [m for m in MODELS if m.pipeline_tag == task and not m.private]
    if key == "downloads":
        return [m.id for m in sorted(public, key=lambda m: m.downloads, reverse=True)]
    return [m.id for m in sorted(public, key=lambda m: m.trending_score or 0, reverse=True)]


@pytest.fixture(autouse=True)
def online_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client must be able to make requests, and must not bring a token of its own."""
    from huggingface_hub import constants

    if constants.is_offline_mode():
        # Not a skip: conftest means this process to stay online, and skipping would hide that it is not.
        pytest.fail(
            "huggingface_hub.constants was first imported with HF_HUB_OFFLINE=1, so the client refuses even "
            "loopback requests. `import huggingface_hub` is lazy in 2.x (constants load on first use), and "
            "xdist workers inherit the environment the controller had after loading conftest: conftest must "
            "import huggingface_hub.constants first and set HF_HUB_OFFLINE per test (monkeypatch), not in "
            "os.environ at import.",
            pytrace=False,
        )
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def hub_server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[HubServer]:
    """The loopback Hub serving MODELS, selected through HF_ENDPOINT, with a private download cache."""
    with HubServer(MODELS) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
        yield server
        # A fetch abandoned at its deadline is still retrying: heal the server so that its next
        # retry succeeds, and wait for it, before the server (and the test) goes away.
        server.heal()
        wait_for_background_fetches()


def wait_for_background_fetches(timeout_s: float = 15.0) -> None:
    """Join fetch threads left running past their deadline, so none outlives its test."""
    deadline = time.monotonic() + timeout_s
    for thread in threading.enumerate():
        if thread.name.startswith("neuron-support-hub-fetch-"):
            thread.join(max(0.0, deadline - time.monotonic()))
            assert not thread.is_alive(), f"{thread.name} still running after {timeout_s} s"


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# --- rankings ------------------------------------------------------------------------------------


def test_env_var_set_after_import_selects_the_server(hub_server: HubServer) -> None:
    from huggingface_hub import constants

    # The client's own copy of HF_ENDPOINT was taken at import, before this server existed.
    assert hub_server.url != constants.ENDPOINT
    ranking = hub.fetch_ranking("text-generation", "trending")
    assert ranking.error is None
    assert ranking.endpoint == hub_server.url
    assert [r.path for r in hub_server.requests] == ["/api/models"]


def test_elapsed_is_the_fetchs_own_time(hub_server: HubServer) -> None:
    # The server holds its answer 0.3 s: the fetch cannot have taken less, nor longer than the
    # call around it (both bounds follow from the order of events, not from a machine's speed).
    hub_server.delay_s = 0.3
    started = time.monotonic()
    ranking = hub.fetch_ranking("text-generation", "trending")
    wall = time.monotonic() - started
    assert ranking.error is None
    # elapsed_s is rounded to the millisecond: a millisecond either side.
    assert 0.3 - 0.001 <= ranking.elapsed_s <= wall + 0.001, (ranking.elapsed_s, wall)


def test_every_task_with_a_row_has_its_hub_rankings() -> None:
    # The viewer's Trending and Downloads views list, for each task the suite can check, the Hub's own
    # leading models: a task row the views left out (sentence embeddings were, once) shows nothing there.
    # Each pipeline tag once: the CTC row and Whisper's rank under automatic-speech-recognition.
    assert set(RANKED_TASKS) == {task.pipeline_tag for task in TASKS.values()} and len(set(RANKED_TASKS)) == len(
        RANKED_TASKS
    )
    assert "automatic-speech-recognition-ctc" not in RANKED_TASKS and "text2text-generation" in RANKED_TASKS
    assert {"feature-extraction", "sentence-similarity", "text-to-image", "automatic-speech-recognition"} <= set(
        RANKED_TASKS
    )


@pytest.mark.parametrize("task", RANKED_TASKS)
@pytest.mark.parametrize("sort", sorted(hub.SORTS))
def test_rankings_follow_the_servers_order_and_filter(hub_server: HubServer, task: str, sort: str) -> None:
    ranking = hub.fetch_ranking(task, sort)

    assert ranking.error is None
    assert (ranking.task, ranking.sort) == (task, sort)
    assert [m.id for m in ranking.models] == expected_order(task, "downloads" if sort == "downloads" else "trending")
    assert {m.pipeline_tag for m in ranking.models} == {task}
    assert ranking.fetched_at.endswith("+00:00")
    [request] = hub_server.requests
    assert request.method == "GET"
    assert request.param("pipeline_tag") == task
    # The client maps list_models' snake_case sort to the Hub's camelCase one.
    assert request.param("sort") == {"trending": "trendingScore", "downloads": "downloads"}[sort]
    assert request.param("limit") == "50"
    assert request.query["expand"] == hub.EXPAND


def test_ranked_models_carry_the_hubs_fields(hub_server: HubServer) -> None:
    ranking = hub.fetch_ranking("text-generation", "downloads")
    by_id = {m.id: m for m in ranking.models}

    llama = by_id["meta/llama-tiny"]
    assert llama == hub.HubModel(
        id="meta/llama-tiny",
        downloads=900,
        likes=40,
        trending_score=12.0,
        pipeline_tag="text-generation",
        library_name="transformers",
        gated="manual",
        created_at="2024-07-01T10:00:00+00:00",
    )
    assert by_id["qwen/qwen-tiny"].gated is False
    assert by_id["org/unscored-gen"].trending_score is None
    assert "secret/private-gen" not in by_id


def test_limit_is_honoured_across_pages(hub_server: HubServer) -> None:
    hub_server.models = [ModelRecord(f"org/gen-{n}", downloads=n, pipeline_tag="text-generation") for n in range(7)]
    hub_server.page_size = 2  # forces the client to follow the Link header, as the Hub's pages do

    ranking = hub.fetch_ranking("text-generation", "downloads", limit=5)

    assert [m.id for m in ranking.models] == ["org/gen-6", "org/gen-5", "org/gen-4", "org/gen-3", "org/gen-2"]
    # Three pages of two, and the client stops there without asking for a fourth.
    assert [r.param("cursor") for r in hub_server.requests] == [None, "2", "4"]


def test_limit_smaller_than_the_task(hub_server: HubServer) -> None:
    ranking = hub.fetch_ranking("text-generation", "trending", limit=2)
    assert [m.id for m in ranking.models] == expected_order("text-generation", "trending")[:2]
    assert hub_server.requests[0].param("limit") == "2"


def test_fetch_all_covers_every_task_and_sort(hub_server: HubServer) -> None:
    rankings = hub.fetch_all(RANKED_TASKS, limit=3)

    assert [(r.task, r.sort) for r in rankings] == [(t, s) for t in RANKED_TASKS for s in hub.SORTS]
    for ranking in rankings:
        assert ranking.error is None
        key = "downloads" if ranking.sort == "downloads" else "trending"
        assert [m.id for m in ranking.models] == expected_order(ranking.task, key)[:3]


def test_bad_arguments_are_the_callers_bug(hub_server: HubServer) -> None:
    with pytest.raises(ValueError, match="unknown sort"):
        hub.fetch_ranking("text-generation", "likes")
    with pytest.raises(ValueError, match="limit"):
        hub.fetch_ranking("text-generation", "trending", limit=0)
    assert hub_server.requests == []


# --- the Hub failing ---------------------------------------------------------------------------------


def test_error_answer_gives_a_ranking_with_the_status_and_server_text(hub_server: HubServer) -> None:
    hub_server.fail_with = 400  # not retried by the client: the answer comes back at once
    hub_server.fail_message = '"limit" must be less than or equal to 1000'

    ranking = hub.fetch_ranking("text-generation", "trending")

    assert ranking.models == ()
    assert ranking.error is not None
    assert ranking.error.startswith("HTTP 400 Bad Request from ")
    assert '"limit" must be less than or equal to 1000' in ranking.error


def test_hub_down_500_within_deadline(hub_server: HubServer) -> None:
    hub_server.fail_with = 500

    started = time.monotonic()
    ranking = hub.fetch_ranking("text-generation", "trending", timeout_s=2)

    # Bounded by the deadline, not by the client's 23 s of retries (the margin is for loaded CI).
    assert time.monotonic() - started < 2 + SLACK_S
    assert ranking.models == ()
    assert ranking.error is not None
    assert "within 2 s" in ranking.error
    # What the client was retrying on when the deadline passed.
    assert "HTTP Error 500" in ranking.error


def test_hub_down_503_after_the_clients_retries(hub_server: HubServer) -> None:
    hub_server.fail_with = 503
    # Retry-After: 0 makes the client wait 1 s between retries instead of 1, 2, 4, 8, 8 s.
    hub_server.retry_after = 0

    ranking = hub.fetch_ranking("text-generation", "trending")

    assert ranking.models == ()
    assert ranking.error is not None
    assert ranking.error.startswith("HTTP 503 Service Unavailable")
    assert "working hard to fix this" in ranking.error
    # One request and five retries: huggingface_hub's http_backoff default.
    assert len(hub_server.requests) == 6


def test_a_blip_is_absorbed_by_the_clients_retries(hub_server: HubServer) -> None:
    hub_server.fail_with = 502
    hub_server.fail_count = 1
    hub_server.retry_after = 0

    ranking = hub.fetch_ranking("image-text-to-text", "downloads")

    assert ranking.error is None
    assert [m.id for m in ranking.models] == expected_order("image-text-to-text", "downloads")
    assert len(hub_server.requests) == 2


def test_unreachable_endpoint_errors_quickly(monkeypatch: pytest.MonkeyPatch) -> None:
    port = closed_port()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")

    started = time.monotonic()
    ranking = hub.fetch_ranking("text-generation", "trending", timeout_s=2)

    assert time.monotonic() - started < 2 + SLACK_S
    assert ranking.models == ()
    assert ranking.endpoint == f"http://127.0.0.1:{port}"
    assert ranking.error is not None
    assert ranking.error.startswith(f"no answer from http://127.0.0.1:{port}/api/models within 2 s")
    assert "thrown while requesting" in ranking.error  # the connection failure the client retried on
    # The abandoned fetch is still retrying (every failed connect resets the client's shared
    # session); bring the endpoint back so it ends here rather than during some later test.
    with HubServer(MODELS, port=port):
        wait_for_background_fetches()


def test_stalled_server_hits_the_deadline(hub_server: HubServer) -> None:
    hub_server.delay_s = math.inf  # the client sets no read timeout on listings

    started = time.monotonic()
    ranking = hub.fetch_ranking("text-generation", "downloads", timeout_s=1)

    assert time.monotonic() - started < 1 + SLACK_S
    assert ranking.error == f"no answer from {hub_server.url}/api/models within 1 s"


def test_fetch_all_stops_asking_when_its_deadline_has_passed(hub_server: HubServer) -> None:
    hub_server.delay_s = math.inf

    started = time.monotonic()
    rankings = hub.fetch_all(RANKED_TASKS, timeout_s=1)

    assert time.monotonic() - started < 1 + SLACK_S
    assert len(rankings) == len(RANKED_TASKS) * len(hub.SORTS)
    # The first ranking gets what is left of the second (a hair under 1 s on a loaded machine).
    assert rankings[0].error is not None
    assert re.fullmatch(rf"no answer from {re.escape(hub_server.url)}/api/models within [\d.]+ s", rankings[0].error)
    for ranking in rankings[1:]:
        assert ranking.error == "not fetched: the 1 s allowed for all rankings had passed"
    assert len(hub_server.requests) == 1


def test_offline_mode_is_reported_not_raised(tmp_path: Path) -> None:
    # HF_HUB_OFFLINE is read at import, so only a fresh interpreter can show this.
    script = (
        "from pytest_neuron_support import hub\nr = hub.fetch_ranking('text-generation', 'trending')\nprint(r.error)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("OfflineModeIsEnabled: ")


# --- tokens ---------------------------------------------------------------------------------------


def test_token_goes_to_the_hub_and_nowhere_else(hub_server: HubServer, tmp_path: Path) -> None:
    ranking = hub.fetch_ranking("text-generation", "trending", token=CANARY)
    hub_server.fail_with = 400
    hub_server.fail_message = f"token {CANARY} rejected"  # a server that echoes the token back
    failed = hub.fetch_ranking("text-generation", "downloads", token=CANARY)

    # Both requests carried exactly this token, as a bearer token, and it was in no other header,
    # the path or the query (the server records those in full, all but the authorization value).
    bearer = hashlib.sha256(f"Bearer {CANARY}".encode()).hexdigest()
    assert [r.authorization_sha256 for r in hub_server.requests] == [bearer, bearer]
    assert all(CANARY not in repr((r.path, r.query, r.headers)) for r in hub_server.requests)
    assert failed.error is not None and CANARY not in failed.error
    snapshot = tmp_path / "rankings.json"
    hub.save_snapshot(snapshot, [ranking, failed])
    assert CANARY not in snapshot.read_text(encoding="utf-8")
    assert CANARY not in repr([ranking, failed])


def test_credentials_in_the_endpoint_are_not_kept(hub_server: HubServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", f"http://mirror-user:s3cret@127.0.0.1:{hub_server.port}")
    ranking = hub.fetch_ranking("text-generation", "trending")
    assert ranking.endpoint == hub_server.url
    assert "s3cret" not in json.dumps(ranking.to_dict())


# --- snapshots -------------------------------------------------------------------------------------


def test_snapshot_round_trip(hub_server: HubServer, tmp_path: Path) -> None:
    rankings = hub.fetch_all(RANKED_TASKS, limit=10)
    hub_server.fail_with = 400
    rankings.append(hub.fetch_ranking("text-generation", "trending"))
    path = tmp_path / "site" / "hub-rankings.json"

    hub.save_snapshot(path, rankings)

    assert hub.load_snapshot(path) == rankings
    assert sorted(p.name for p in path.parent.iterdir()) == ["hub-rankings.json"]  # no temp file left
    document = json.loads(path.read_text(encoding="utf-8"))
    assert (document["format"], document["version"]) == (hub.SNAPSHOT_FORMAT, hub.SNAPSHOT_VERSION)


def test_snapshot_replaces_the_previous_one(tmp_path: Path) -> None:
    path = tmp_path / "hub-rankings.json"
    first = hub.HubRanking("text-generation", "trending", "2025-01-01T00:00:00+00:00", "x", 0.1, (), "down")
    second = hub.HubRanking("text-generation", "downloads", "2025-01-02T00:00:00+00:00", "x", 0.2, (), None)
    hub.save_snapshot(path, [first])
    hub.save_snapshot(path, [second])
    assert hub.load_snapshot(path) == [second]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", "not a JSON"),
        ('{"format": "something-else", "version": 1, "rankings": []}', "not a hub-rankings snapshot"),
        ('{"format": "neuron-support/hub-rankings", "version": 99, "rankings": []}', "version 99"),
        ('{"format": "neuron-support/hub-rankings", "version": 1, "rankings": [{"task": 1}]}', "models"),
    ],
)
def test_malformed_snapshot_raises_hub_error(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "hub-rankings.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(hub.HubError, match=message):
        hub.load_snapshot(path)


def test_model_from_dict_rejects_mistyped_fields() -> None:
    good = hub.HubModel("a/b", 1, 2, None, None, None, None, None).to_dict()
    assert hub.HubModel.from_dict(good).id == "a/b"
    with pytest.raises(hub.HubError, match="downloads"):
        hub.HubModel.from_dict({**good, "downloads": True})
    with pytest.raises(hub.HubError, match="gated"):
        hub.HubModel.from_dict({**good, "gated": 3})


# --- the server speaks the Hub's API (for the planner and other users) -----------------------------


def test_model_info_and_its_safetensors_block(hub_server: HubServer) -> None:
    from huggingface_hub import HfApi

    info = HfApi(endpoint=hub_server.url).model_info("qwen/qwen-tiny")

    assert info.id == "qwen/qwen-tiny"
    assert info.pipeline_tag == "text-generation"
    assert info.safetensors is not None
    assert info.safetensors.parameters == {"BF16": 1024 * 512 + 512 * 512, "F32": 512}
    assert info.safetensors.total == 1024 * 512 + 512 * 512 + 512
    assert {s.rfilename for s in info.siblings or []} == {
        "config.json",
        "model.safetensors.index.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    }
    at_revision = HfApi(endpoint=hub_server.url).model_info("qwen/qwen-tiny", revision=info.sha)
    assert at_revision.sha == info.sha
    assert hub_server.requests[-1].path == f"/api/models/qwen/qwen-tiny/revision/{info.sha}"


def test_unknown_repo_and_revision_raise_the_clients_errors(hub_server: HubServer) -> None:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    api = HfApi(endpoint=hub_server.url)
    with pytest.raises(RepositoryNotFoundError) as missing:
        api.model_info("nobody/nothing")
    assert missing.value.response.status_code == 404
    assert missing.value.response.headers["X-Error-Code"] == "RepoNotFound"
    with pytest.raises(RevisionNotFoundError):
        api.model_info("qwen/qwen-tiny", revision="v9")


def test_private_repo_is_invisible_without_an_accepted_token(hub_server: HubServer) -> None:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError

    api = HfApi(endpoint=hub_server.url)
    with pytest.raises(RepositoryNotFoundError) as anonymous:
        api.model_info("secret/private-gen", token=False)
    assert anonymous.value.response.status_code == 401
    with pytest.raises(RepositoryNotFoundError) as wrong:
        api.model_info("secret/private-gen", token="hf_wrong")
    assert wrong.value.response.status_code == 404
    hub_server.tokens.add("hf_granted")
    assert api.model_info("secret/private-gen", token="hf_granted").private is True


def test_gated_repo_metadata_is_public_but_files_are_not(hub_server: HubServer) -> None:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError

    api = HfApi(endpoint=hub_server.url)
    # As on the Hub: model info of a gated repo answers anyone; the gate is on the files.
    assert api.model_info("meta/llama-tiny", token=False).gated == "manual"
    with pytest.raises(GatedRepoError) as anonymous:
        api.get_safetensors_metadata("meta/llama-tiny", token=False)
    assert anonymous.value.response.status_code == 401
    with pytest.raises(GatedRepoError) as not_granted:
        api.get_safetensors_metadata("meta/llama-tiny", token="hf_not_granted")
    assert not_granted.value.response.status_code == 403
    assert "not in the authorized list" in str(not_granted.value)
    hub_server.tokens.add("hf_granted")
    granted = api.get_safetensors_metadata("meta/llama-tiny", token="hf_granted")
    assert granted.parameter_count == {"BF16": 320 * 64, "F32": 64}
    assert not any("hf_granted" in json.dumps(r.headers) for r in hub_server.requests)


def test_safetensors_metadata_single_file_via_range_requests(hub_server: HubServer) -> None:
    from huggingface_hub import HfApi

    hub_server.tokens.add("hf_granted")
    metadata = HfApi(endpoint=hub_server.url).get_safetensors_metadata("meta/llama-tiny", token="hf_granted")

    assert metadata.sharded is False
    assert metadata.files_metadata["model.safetensors"].tensors["embed.weight"].shape == [320, 64]
    resolve = hub_server.requests_to("/meta/llama-tiny/resolve/main/model.safetensors")
    assert [r.method for r in resolve] == ["HEAD", "GET"]
    assert resolve[1].headers["range"] == "bytes=0-100000"


def test_safetensors_metadata_sharded_via_the_index(hub_server: HubServer) -> None:
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub_server.url)
    metadata = api.get_safetensors_metadata("qwen/qwen-tiny")

    assert metadata.sharded is True
    assert metadata.parameter_count == {"BF16": 1024 * 512 + 512 * 512, "F32": 512}
    assert set(metadata.files_metadata) == {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}
    # The one-request variant the Hub also offers gives the same counts.
    assert api.get_sharded_safetensors_metadata("qwen/qwen-tiny").parameter_count == metadata.parameter_count


def test_range_answers_match_the_file(hub_server: HubServer) -> None:
    from huggingface_hub import get_session, hf_hub_download

    url = f"{hub_server.url}/qwen/qwen-tiny/resolve/main/model-00002-of-00002.safetensors"
    session = get_session()
    head = session.head(url)
    size = int(head.headers["Content-Length"])
    assert head.status_code == 200
    assert head.headers["Accept-Ranges"] == "bytes"
    tail = session.get(url, headers={"Range": "bytes=-16"})
    assert tail.status_code == 206
    assert tail.headers["Content-Range"] == f"bytes {size - 16}-{size - 1}/{size}"
    assert tail.content == bytes(16)
    beyond = session.get(url, headers={"Range": f"bytes={size}-"})
    assert beyond.status_code == 416
    config = hf_hub_download("qwen/qwen-tiny", "config.json", endpoint=hub_server.url)
    assert json.loads(Path(config).read_text(encoding="utf-8")) == {"model_type": "qwen2"}


def test_module_level_client_helpers_need_the_env_var_at_import(hub_server: HubServer, tmp_path: Path) -> None:
    # huggingface_hub.get_safetensors_metadata (what the planner calls) is bound to an HfApi made
    # at import, so it follows HF_ENDPOINT only when the variable is set before the import.
    script = (
        "from huggingface_hub import get_safetensors_metadata\n"
        "print(sum(get_safetensors_metadata('qwen/qwen-tiny').parameter_count.values()))\n"
    )
    env = {
        **os.environ,
        **hub_server.env(),
        "HF_HUB_CACHE": str(tmp_path / "cache"),
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    }
    env.pop("TRANSFORMERS_OFFLINE", None)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == 1024 * 512 + 512 * 512 + 512


def test_fetch_all_gives_up_at_once_when_the_hub_is_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    # One connection attempt for the whole batch: a refused port is said once per ranking, with
    # no request made and no fetch left retrying in the background.
    port = closed_port()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    assert hub.unreachable() == f"http://127.0.0.1:{port} is unreachable (Connection refused)"
    rankings = hub.fetch_all(RANKED_TASKS, timeout_s=60)
    assert len(rankings) == len(RANKED_TASKS) * len(hub.SORTS)
    assert {r.error for r in rankings} == {f"not fetched: http://127.0.0.1:{port} is unreachable (Connection refused)"}
    assert not [t for t in threading.enumerate() if t.name.startswith("neuron-support-hub-fetch-")]


def test_a_reachable_hub_is_not_unreachable(hub_server: HubServer) -> None:
    assert hub.unreachable() is None
    assert hub_server.requests == []  # a connection opened, nothing asked
