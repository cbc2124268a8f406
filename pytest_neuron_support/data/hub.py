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
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit, urlunsplit

from pytest_neuron_support.base.redaction import scrub
from pytest_neuron_support.base.storage import write_atomic

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
# Seconds to open a connection to the Hub before it counts as unreachable: a refused port or a
# failed DNS lookup answers at once; a network that drops packets is given this long.
REACH_TIMEOUT_S = 3.0
# Two minutes for all four rankings: enough for the client to exhaust its retries on one ranking
# (about 23 s) for each, short enough that a viewer build with the Hub down still finishes.
DEFAULT_TOTAL_TIMEOUT_S = 120.0

SNAPSHOT_FORMAT = "neuron-support/hub-rankings"
SNAPSHOT_VERSION = 1

# User access tokens start with "hf_"; anything shaped like one is scrubbed from error texts even
# when it is not the token we were given (the client may have picked one up from HF_TOKEN).
_TOKEN_PATTERN = re.compile(r"hf_[A-Za-z0-9]{16,}")
# The "user:password@" of a URL quoted in an error text (the client logs full URLs).
_USERINFO_PATTERN = re.compile(r"//[^/@\s]+@")

_T = TypeVar("_T")


class HubError(Exception):
    """A snapshot (or a dict meant to become a ranking) is malformed or of an unsupported version."""


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


def hub_endpoint() -> str:
    """The endpoint the client should ask: ``HF_ENDPOINT`` as set now, else the client's default.

    The client's default (``huggingface_hub.constants.ENDPOINT``) is read from ``HF_ENDPOINT`` at
    import time, so it is only the fallback: a test or a CLI run that sets the variable later
    still gets the server it named.
    """
    from huggingface_hub import constants

    configured = os.environ.get("HF_ENDPOINT", "").strip().rstrip("/")
    return configured or str(constants.ENDPOINT)


def _offline() -> bool:
    """HF_HUB_OFFLINE as the client reads it: once, at its import (what the client then does)."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def is_unreachable(exc: BaseException) -> bool:
    """True when the Hub could not be reached at all (refused, no route, DNS, timeout)."""
    seen: BaseException | None = exc
    while seen is not None:
        name = type(seen).__name__
        if "Connect" in name or "Timeout" in name or isinstance(seen, ConnectionError):
            return True
        text = str(seen)
        if "Connection refused" in text or "Name or service not known" in text or "Temporary failure" in text:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def unreachable(timeout_s: float = REACH_TIMEOUT_S) -> str | None:
    """Why the Hub cannot be asked now, in one short line; None when a connection to it opens.

    ``HF_HUB_OFFLINE=1``, or the endpoint's host and port refusing, failing to resolve or not
    answering within ``timeout_s``. Asked once before a batch of Hub calls, so that a machine
    without network gives up in seconds, instead of sitting through the client's retries (about
    23 s per request) model after model.
    """
    if _offline():
        return "HF_HUB_OFFLINE=1"
    endpoint = hub_endpoint()
    parts = urlsplit(endpoint)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        return f"{_without_credentials(endpoint)} is unreachable ({reason})"
    return None


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
        models = tuple(_with_deadline(ask, timeout_s, f"{_without_credentials(endpoint)}/api/models"))
    # The client's failures come from its HTTP library (httpx2 in huggingface_hub 2.x, httpx in
    # 1.x, requests before), from its own HfHubHTTPError, from offline mode, or from a payload it
    # cannot parse; naming them would pin one client version, and each means the same to the
    # viewer: no ranking this time, and the message says why.
    except Exception as exc:
        error = _scrub(_describe(exc), token)
    return HubRanking(
        task=task,
        sort=sort,
        fetched_at=fetched_at,
        endpoint=_without_credentials(endpoint),
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
    """Every ranking the viewer shows: each of ``tasks`` (the task table's ``ranked`` rows) in each order of
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
    down = None if _offline() else unreachable()
    for task in tasks:
        for sort in SORTS:
            remaining = deadline - time.monotonic()
            if down is not None or remaining <= 0:
                rankings.append(
                    HubRanking(
                        task=task,
                        sort=sort,
                        fetched_at=_utc_now(),
                        endpoint=_without_credentials(hub_endpoint()),
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


# --- helpers -----------------------------------------------------------------------------------


class _RetryNotes(logging.Handler):
    """Keeps the client's last "... thrown while requesting ..." warning logged by one thread.

    The client swallows the failures it retries and only logs them; when the deadline passes
    mid-retry these notes are the only record of what went wrong (a 503, a refused connection).
    """

    def __init__(self, thread_name: str) -> None:
        super().__init__(logging.WARNING)
        self.thread_name = thread_name
        self.last: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if record.threadName == self.thread_name:
            message = record.getMessage()
            if "thrown while requesting" in message:
                self.last = message


_fetch_counter = 0
_fetch_counter_lock = threading.Lock()


def _with_deadline(call: Callable[[], _T], timeout_s: float, what: str) -> _T:
    """``call()``'s result or exception, or TimeoutError once ``timeout_s`` seconds have passed.

    The call runs in a daemon thread because the client cannot be interrupted: it sleeps between
    retries and sets no read timeout on listings. A call still running at the deadline is left to
    finish (or fail) on its own; a daemon thread never holds up interpreter exit.
    """
    global _fetch_counter
    with _fetch_counter_lock:
        _fetch_counter += 1
        name = f"neuron-support-hub-fetch-{_fetch_counter}"
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # handed to the caller's thread, which decides
            outcome["error"] = exc

    notes = _RetryNotes(name)
    client_logger = logging.getLogger("huggingface_hub")
    client_logger.addHandler(notes)
    try:
        worker = threading.Thread(target=run, name=name, daemon=True)
        worker.start()
        worker.join(timeout_s)
    finally:
        client_logger.removeHandler(notes)
    if worker.is_alive():
        detail = f"; the client was retrying after: {notes.last}" if notes.last else ""
        raise TimeoutError(f"no answer from {what} within {timeout_s:.3g} s{detail}")
    if "error" in outcome:
        raise outcome["error"]
    value: _T = outcome["value"]
    return value


def _describe(exc: BaseException) -> str:
    """A one-paragraph account of a failed fetch: status and server text for HTTP errors."""
    if isinstance(exc, TimeoutError) and str(exc).startswith("no answer from"):
        return str(exc)
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if response is not None and isinstance(status, int):
        reason = str(getattr(response, "reason_phrase", "") or "").strip()
        try:
            url: object = response.request.url
        # httpx-style responses raise RuntimeError when built without a request (never from the
        # client itself, but a missing URL must not turn a described error into a crash).
        except (AttributeError, RuntimeError):
            url = None
        where = f" from {_without_query(str(url))}" if url is not None else ""
        server = getattr(exc, "server_message", None)
        text = str(server).strip() if server else _first_line(str(exc))
        return f"HTTP {status}{' ' + reason if reason else ''}{where}: {text}"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _scrub(text: str, token: str | None) -> str:
    if token:
        text = text.replace(token, "***")
    # token=None lets the client send HF_TOKEN (or another secret variable) itself: mask those values
    # too, whatever their shape (the pattern below knows only user tokens, hf_...).
    text = scrub(text) or ""
    text = _USERINFO_PATTERN.sub("//", text)
    return _TOKEN_PATTERN.sub("hf_***", text)


def _without_credentials(url: str) -> str:
    """``url`` without any ``user:password@`` part (an HF_ENDPOINT proxy URL may carry one)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port is not None else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _without_query(url: str) -> str:
    parts = urlsplit(_without_credentials(url))
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return text.strip()


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


# --------------------------------------------------------------------------------------------------
# Files and safetensors metadata of one repository (the planner's questions)
# --------------------------------------------------------------------------------------------------


def download_file(repo_id: str, filename: str, *, revision: str | None, local_only: bool = False) -> Path:
    """``filename`` of ``repo_id`` from the Hugging Face cache, downloaded if it is not there (unless
    ``local_only``). Raises what huggingface_hub raises (offline and not cached, not found, gated, HTTP)."""
    from huggingface_hub import hf_hub_download

    path = hf_hub_download(repo_id, filename, revision=revision, local_files_only=local_only)
    if not isinstance(path, str):
        raise HubError(f"{repo_id}: hf_hub_download returned no file for {filename}")
    return Path(path)


def cached_file(repo_id: str, filename: str, *, revision: str | None) -> Path | None:
    """``filename`` of ``repo_id`` when it is already in the Hugging Face cache, else None (never a
    request)."""
    from huggingface_hub import try_to_load_from_cache

    # A path only when the file is cached; None or a "known missing" sentinel otherwise.
    found = try_to_load_from_cache(repo_id, filename, revision=revision)
    return Path(found) if isinstance(found, str) else None


def safetensors_parameters(
    repo_id: str,
    *,
    revision: str | None,
    count: Callable[[str, str, list[int]], int],
    is_expert: Callable[[str], bool],
) -> tuple[int, int]:
    """(parameters, expert parameters) of ``repo_id`` from the Hub's safetensors metadata API (the
    headers only, no weights): each tensor counts ``count(name, dtype, shape)`` weights, as an
    expert's when ``is_expert(name)``. The metadata's own ``parameter_count`` is the header's elements,
    which is not the weights a packed dtype loads as."""
    from huggingface_hub import get_safetensors_metadata

    metadata = get_safetensors_metadata(repo_id, revision=revision)
    total = experts = 0
    for file in metadata.files_metadata.values():
        for name, tensor in file.tensors.items():
            weights = count(name, str(tensor.dtype), list(tensor.shape))
            total += weights
            experts += weights if is_expert(name) else 0
    return total, experts


def repo_files(repo_id: str, *, revision: str | None) -> list[str]:
    """Every file of ``repo_id`` at ``revision``, as the model's info lists them (its ``siblings``: the
    planner's question for a repository whose weights are in several folders, a diffusers pipeline's)."""
    from huggingface_hub import HfApi

    info = HfApi().model_info(repo_id, revision=revision)
    return [sibling.rfilename for sibling in info.siblings or ()]


def safetensors_file_parameters(repo_id: str, filename: str, *, revision: str | None) -> int:
    """The elements of every tensor of one safetensors file of ``repo_id``, from its header as the Hub's
    API reads it (a range request; no weights)."""
    from huggingface_hub import HfApi

    metadata = HfApi().parse_safetensors_file_metadata(repo_id, filename, revision=revision)
    return sum(int(count) for count in metadata.parameter_count.values())
