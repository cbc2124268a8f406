"""The Hub's live rankings for the viewer: trending and most-downloaded models per task.

Besides the curated catalog, the viewer shows per task a "Trending" and a "Downloads" view that
follow the Hugging Face Hub's own ranking, tested or not. This module asks the Hub for those
rankings through the real ``huggingface_hub`` client (``HfApi.list_models``) and keeps them as a
JSON snapshot the viewer build reads::

    rankings = fetch_all(RANKED_TASKS, limit=50)
    save_snapshot(Path("site/hub-rankings.json"), rankings)
    ...
    rankings = load_snapshot(Path("site/hub-rankings.json"))

Which server is asked: ``HF_ENDPOINT`` as set *when the fetch runs*. ``huggingface_hub`` copies
``HF_ENDPOINT`` into ``huggingface_hub.constants.ENDPOINT`` once, at import, and a bare ``HfApi()``
uses that copy; so :func:`fetch_ranking` reads the environment variable itself and passes it as
``HfApi(endpoint=...)``, which the client honours for every URL it builds. Setting
``HF_ENDPOINT`` after ``huggingface_hub`` was imported therefore still works here (it does not
for the client's module-level helpers such as ``huggingface_hub.get_safetensors_metadata``,
which are bound to an ``HfApi()`` made at import).

A failed fetch never raises: a viewer build must not crash because the Hub is down. The ranking
comes back with ``error`` set (status code and the server's error text when there was an
answer) and no models. The client retries 5xx answers and connection errors itself, with
exponential backoff (1+2+4+8+8 s), and waits forever for a stalled server; each fetch therefore
runs against a deadline (``timeout_s``) and reports what the client was retrying on when the
deadline passed.

Tokens are passed to the client and go nowhere else: not into snapshots, not into error texts
(anything that looks like a Hugging Face token is scrubbed from those), not into logs.
``huggingface_hub`` is imported inside the functions that use it, so importing this module stays
cheap.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, TypeVar

from pytest_neuron_support.base.storage import write_atomic
from pytest_neuron_support.hub.reach import (
    HubError,
    describe,
    hub_endpoint,
    offline,
    scrub_token,
    unreachable,
    with_deadline,
    without_credentials,
)

# Subsets of huggingface_hub's ModelSort_T and ExpandModelProperty_T, spelled out here so that
# type-checking the calls does not need the client imported at module level.
_Sort = Literal["trending_score", "downloads"]
_Expand = Literal["downloads", "likes", "trendingScore", "pipeline_tag", "library_name", "gated", "createdAt"]

# The viewer's names for the views -> the ``sort`` values HfApi.list_models accepts.
SORTS: dict[str, _Sort] = {"trending": "trending_score", "downloads": "downloads"}

# Properties asked of the Hub for each listed model. Without ``expand`` the Hub's listing omits
# ``gated``; with it, the Hub returns exactly these (plus ``id``), which keeps the answer small.
EXPAND: tuple[_Expand, ...] = (
    "downloads",
    "likes",
    "trendingScore",
    "pipeline_tag",
    "library_name",
    "gated",
    "createdAt",
)

DEFAULT_TIMEOUT_S = 60.0
# Two minutes for every ranking together (two per task of the task table): a Hub that answers gives them all in
# seconds; one that fails each request after the client's retries (about 23 s a ranking) gets the first few
# tried and the rest marked "not fetched", so a viewer build with the Hub failing still ends in two minutes.
DEFAULT_TOTAL_TIMEOUT_S = 120.0

SNAPSHOT_FORMAT = "neuron-support/hub-rankings"
SNAPSHOT_VERSION = 1

_T = TypeVar("_T")


@dataclass(frozen=True)
class HubModel:
    """One model of a Hub ranking, as the Hub listed it.

    Attributes:
        id: the repository id, e.g. ``Qwen/Qwen3-8B``.
        downloads: downloads over the last 30 days (the Hub's ``downloads``); 0 if not reported.
        likes: total likes; 0 if not reported.
        trending_score: the Hub's ``trendingScore`` (recent likes, decayed), or None if not reported.
        pipeline_tag: the model's task on the Hub, e.g. ``text-generation``; None if it has none.
        library_name: e.g. ``transformers``; None if the Hub names none.
        gated: False for open models, ``"auto"`` or ``"manual"`` for gated ones (the Hub's
            approval mode), None if not reported.
        created_at: when the repository was created, ISO 8601 in UTC, or None if not reported.
    """

    id: str
    downloads: int
    likes: int
    trending_score: float | None
    pipeline_tag: str | None
    library_name: str | None
    gated: bool | str | None
    created_at: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "downloads": self.downloads,
            "likes": self.likes,
            "trending_score": self.trending_score,
            "pipeline_tag": self.pipeline_tag,
            "library_name": self.library_name,
            "gated": self.gated,
            "created_at": self.created_at,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HubModel:
        """Inverse of :meth:`to_dict`; raises :class:`HubError` on a missing or mistyped field."""
        gated = data.get("gated")
        if gated is not None and not isinstance(gated, (bool, str)):
            raise HubError(f"model field 'gated' must be a bool, a string or null (got {gated!r})")
        return cls(
            id=_field(data, "id", str),
            downloads=_int_field(data, "downloads"),
            likes=_int_field(data, "likes"),
            trending_score=_optional_float(data, "trending_score"),
            pipeline_tag=_optional(data, "pipeline_tag", str),
            library_name=_optional(data, "library_name", str),
            gated=gated,
            created_at=_optional(data, "created_at", str),
        )

    @classmethod
    def from_model_info(cls, info: Any) -> HubModel:
        """From a ``huggingface_hub.hf_api.ModelInfo`` (typed ``Any``: the client ships no stubs we check)."""
        created = info.created_at
        trending = info.trending_score
        return cls(
            id=str(info.id),
            downloads=int(info.downloads or 0),
            likes=int(info.likes or 0),
            trending_score=None if trending is None else float(trending),
            pipeline_tag=info.pipeline_tag,
            library_name=info.library_name,
            gated=info.gated,
            created_at=None if created is None else created.astimezone(timezone.utc).isoformat(),
        )


@dataclass(frozen=True)
class HubRanking:
    """One of the Hub's live rankings: the top models of a task in one sort order, when asked.

    Attributes:
        task: the pipeline tag ranked, e.g. ``text-generation``.
        sort: the viewer's name for the order, a key of :data:`SORTS` (``trending`` or ``downloads``).
        fetched_at: when the fetch started, ISO 8601 in UTC.
        endpoint: the Hub endpoint asked (``HF_ENDPOINT`` or the client's default), without any
            credentials a proxy URL may carry.
        elapsed_s: seconds the fetch took, including the client's retries.
        models: the ranked models, best first, as many as the limit asked for (fewer if the Hub has
            fewer); empty when ``error`` is set.
        error: None on success; otherwise why there are no models (the HTTP status and the
            server's error text, the connection failure, or the deadline that passed).
    """

    task: str
    sort: str
    fetched_at: str
    endpoint: str
    elapsed_s: float
    models: tuple[HubModel, ...]
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "sort": self.sort,
            "fetched_at": self.fetched_at,
            "endpoint": self.endpoint,
            "elapsed_s": self.elapsed_s,
            "error": self.error,
            "models": [model.to_dict() for model in self.models],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HubRanking:
        """Inverse of :meth:`to_dict`; raises :class:`HubError` on a missing or mistyped field."""
        models = data.get("models")
        if not isinstance(models, list) or not all(isinstance(model, Mapping) for model in models):
            raise HubError(f"ranking field 'models' must be a list of objects (got {type(models).__name__})")
        elapsed = data.get("elapsed_s")
        if isinstance(elapsed, bool) or not isinstance(elapsed, (int, float)):
            raise HubError(f"ranking field 'elapsed_s' must be a number (got {elapsed!r})")
        return cls(
            task=_field(data, "task", str),
            sort=_field(data, "sort", str),
            fetched_at=_field(data, "fetched_at", str),
            endpoint=_field(data, "endpoint", str),
            elapsed_s=float(elapsed),
            models=tuple(HubModel.from_dict(model) for model in models),
            error=_optional(data, "error", str),
        )


def fetch_ranking(
    task: str,
    sort: str,
    limit: int = 50,
    *,
    token: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> HubRanking:
    """The Hub's top ``limit`` models for ``task`` in ``sort`` order; never raises for Hub trouble.

    ``sort`` is a key of :data:`SORTS`. ``token`` is passed to the client only (None lets the
    client use a locally saved token or ``HF_TOKEN``, as it always does). An error answer, an
    unreachable endpoint, offline mode or no answer within ``timeout_s`` seconds (the client's own
    retries included) gives a ranking with ``error`` set and no models. Invalid arguments raise
    ``ValueError``: those are the caller's bugs, not the Hub's.
    """
    if sort not in SORTS:
        raise ValueError(f"unknown sort {sort!r}; expected one of {sorted(SORTS)}")
    if not task:
        raise ValueError("task must be a non-empty pipeline tag")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be a positive integer (got {limit!r})")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be positive (got {timeout_s!r})")

    from huggingface_hub import HfApi

    endpoint = hub_endpoint()
    fetched_at = _utc_now()
    started = time.monotonic()
    api = HfApi(endpoint=endpoint)

    def ask() -> list[HubModel]:
        listing = api.list_models(pipeline_tag=task, sort=SORTS[sort], limit=limit, expand=list(EXPAND), token=token)
        return [HubModel.from_model_info(info) for info in listing]

    models: tuple[HubModel, ...] = ()
    error: str | None = None
    try:
        models = tuple(with_deadline(ask, timeout_s, f"{without_credentials(endpoint)}/api/models"))
    # The client's failures come from its HTTP library (httpx2 in huggingface_hub 2.x, httpx in
    # 1.x, requests before), from its own HfHubHTTPError, from offline mode, or from a payload it
    # cannot parse; naming them would pin one client version, and each means the same to the
    # viewer: no ranking this time, and the message says why.
    except Exception as exc:
        error = scrub_token(describe(exc), token)
    return HubRanking(
        task=task,
        sort=sort,
        fetched_at=fetched_at,
        endpoint=without_credentials(endpoint),
        elapsed_s=round(time.monotonic() - started, 3),
        models=models,
        error=error,
    )


def fetch_all(
    tasks: Sequence[str],
    limit: int = 50,
    token: str | None = None,
    *,
    timeout_s: float = DEFAULT_TOTAL_TIMEOUT_S,
) -> list[HubRanking]:
    """Every ranking the viewer shows: each of ``tasks`` (every task of the task table) in each order of
    :data:`SORTS`.

    Fetched one after another (the client shares one HTTP session across threads and resets it on
    connection errors, so parallel fetches against a failing Hub would disturb each other) under
    one overall deadline of ``timeout_s`` seconds: once it has passed, the remaining rankings are
    not asked for and carry an error saying so.
    """
    deadline = time.monotonic() + timeout_s
    rankings: list[HubRanking] = []
    # Offline mode is the client's to report (each ranking says OfflineModeIsEnabled); a Hub that
    # cannot be reached at all is said once, at once, for every ranking.
    down = None if offline() else unreachable()
    for task in tasks:
        for sort in SORTS:
            remaining = deadline - time.monotonic()
            if down is not None or remaining <= 0:
                rankings.append(
                    HubRanking(
                        task=task,
                        sort=sort,
                        fetched_at=_utc_now(),
                        endpoint=without_credentials(hub_endpoint()),
                        elapsed_s=0.0,
                        models=(),
                        error=f"not fetched: {down}"
                        if down is not None
                        else f"not fetched: the {timeout_s:.3g} s allowed for all rankings had passed",
                    )
                )
                continue
            rankings.append(fetch_ranking(task, sort, limit, token=token, timeout_s=remaining))
    return rankings


def save_snapshot(path: Path, rankings: Sequence[HubRanking]) -> None:
    """Write ``rankings`` as JSON to ``path`` atomically (a reader sees the old file or the new one)."""
    document = {
        "format": SNAPSHOT_FORMAT,
        "version": SNAPSHOT_VERSION,
        "rankings": [ranking.to_dict() for ranking in rankings],
    }
    text = json.dumps(document, indent=1, ensure_ascii=False) + "\n"
    write_atomic(path, text)


def load_snapshot(path: Path) -> list[HubRanking]:
    """The rankings :func:`save_snapshot` wrote; :class:`HubError` if the file is not such a snapshot.

    ``OSError`` (e.g. a missing file) propagates: whether that is fatal is the caller's decision.
    """
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HubError(f"{path}: not a JSON hub-rankings snapshot: {exc}") from exc
    if not isinstance(document, dict) or document.get("format") != SNAPSHOT_FORMAT:
        raise HubError(f"{path}: not a hub-rankings snapshot (no format {SNAPSHOT_FORMAT!r})")
    if document.get("version") != SNAPSHOT_VERSION:
        raise HubError(f"{path}: snapshot version {document.get('version')!r} is not {SNAPSHOT_VERSION}")
    rankings = document.get("rankings")
    if not isinstance(rankings, list) or not all(isinstance(item, dict) for item in rankings):
        raise HubError(f"{path}: 'rankings' must be a list of objects")
    try:
        return [HubRanking.from_dict(item) for item in rankings]
    except HubError as exc:
        raise HubError(f"{path}: {exc}") from exc


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _field(data: Mapping[str, Any], key: str, kind: type[_T]) -> _T:
    value = data.get(key)
    if not isinstance(value, kind):
        raise HubError(f"field {key!r} must be a {kind.__name__} (got {value!r})")
    return value


def _optional(data: Mapping[str, Any], key: str, kind: type[_T]) -> _T | None:
    value = data.get(key)
    if value is not None and not isinstance(value, kind):
        raise HubError(f"field {key!r} must be a {kind.__name__} or null (got {value!r})")
    return value


def _int_field(data: Mapping[str, Any], key: str) -> int:
    value = data.get(key)
    # bool is an int subclass; a true/false here is corruption, not a count.
    if isinstance(value, bool) or not isinstance(value, int):
        raise HubError(f"field {key!r} must be an integer (got {value!r})")
    return value


def _optional_float(data: Mapping[str, Any], key: str) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise HubError(f"field {key!r} must be a number or null (got {value!r})")
    return float(value)
