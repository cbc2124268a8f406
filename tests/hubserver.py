"""A loopback HTTP server speaking the parts of the Hugging Face Hub API this project's client uses.

Tests point the real ``huggingface_hub`` client at it with ``HF_ENDPOINT`` instead of patching
anything, so what is tested is the request the client really sends and the answer it really
parses. The server is a ``ThreadingHTTPServer`` on 127.0.0.1 with an ephemeral port, serving an
in-memory list of :class:`ModelRecord`::

    from hubserver import HubServer, ModelRecord   # tests/ is on sys.path under pytest (see below)

    with HubServer([ModelRecord("org/tiny", pipeline_tag="text-generation", downloads=10)]) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        ...
        assert hub.requests[0].path == "/api/models"

Importing it: ``tests/`` has no ``__init__.py``, so pytest's default ("prepend") import mode puts
``tests/`` on ``sys.path`` for every test module in it and ``from hubserver import ...`` works when
running ``pytest tests`` from the repository root (with or without xdist).

Served (the Hub's own paths and answers, as ``huggingface_hub`` 2.x calls and parses them):

* ``GET /api/models``: filtered by ``pipeline_tag``, ``author``, ``search``, ``filter`` (tags),
  ``gated``; sorted by ``sort`` (``downloads``, ``likes``, ``trendingScore``, ``createdAt``,
  ``lastModified``), descending unless ``direction=1``; ``limit`` sets the page size (at most
  :attr:`HubServer.page_size`) and further pages are linked with a ``Link: <...>; rel="next"``
  header carrying a ``cursor``, as the Hub does. Fields: the Hub's default listing fields, more
  with ``full``, exactly ``expand``/``expand[]`` (plus ``id``/``_id``) when given.
* ``GET /api/models/{repo_id}`` and ``/api/models/{repo_id}/revision/{rev}``: model info,
  with ``siblings`` and a ``safetensors`` block (``{"parameters": {dtype: n}, "total": n}``) when
  the record has tensors.
* ``GET /api/models/{repo_id}/safetensors-metadata/{filename}``: every shard header at once
  (``HfApi.get_sharded_safetensors_metadata``).
* ``HEAD``/``GET /{repo_id}/resolve/{rev}/{path}``: repository files with ``ETag``,
  ``X-Repo-Commit`` and ``Content-Length``; ``Range: bytes=a-b`` answered with 206. The record's
  tensors become real safetensors files (a real header, zero bytes for the data, never held in
  memory), sharded with a ``model.safetensors.index.json`` when ``shards > 1``.

Errors, with the Hub's ``X-Error-Code``/``X-Error-Message`` headers and JSON ``{"error": ...}``
bodies, so the client raises its real exception types: unknown repo 404 ``RepoNotFound``; private
repo 401 ``RepoNotFound`` without a token (404 with one the server does not accept); gated repo
files 401 ``GatedRepo`` without a token, 403 ``GatedRepo`` with one not in :attr:`HubServer.tokens`
(model info of a gated repo is public, as on the Hub); unknown revision 404 ``RevisionNotFound``;
unknown file 404 ``EntryNotFound``; bad query values 400. Failure knobs: :attr:`HubServer.fail_with`
("Hub down": every request, or those under :attr:`HubServer.fail_path`, answers that status,
optionally only :attr:`HubServer.fail_count` times), :attr:`HubServer.retry_after` (sent with
failures; the client sleeps that + 1 s between its retries) and :attr:`HubServer.delay_s` (answer
late, or never: ``math.inf``). :meth:`HubServer.heal` ends all of these at once and releases waiting
answers, so a client a test abandoned at its deadline finishes on its next retry; ``HubServer(port=p)``
brings back an endpoint a test had closed.

Every request is recorded (:class:`RecordedRequest`): method, path, query, headers without
``Authorization``, and only *whether* an ``Authorization`` header was sent, never its value.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import struct
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

# Bytes per element of each safetensors dtype.
DTYPE_SIZES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "U16": 2,
    "I16": 2,
    "F16": 2,
    "BF16": 2,
    "U32": 4,
    "I32": 4,
    "F32": 4,
    "U64": 8,
    "I64": 8,
    "F64": 8,
}

# Fields of a listing entry when the request has neither ``expand`` nor ``full`` (the Hub's default).
LIST_FIELDS = (
    "_id",
    "id",
    "likes",
    "trendingScore",
    "private",
    "downloads",
    "tags",
    "pipeline_tag",
    "library_name",
    "createdAt",
    "modelId",
)
# Added by ``full=true``.
FULL_FIELDS = ("author", "sha", "lastModified", "gated", "disabled", "siblings")
# What ``expand`` may name (huggingface_hub's ExpandModelProperty_T); anything else is a 400.
EXPAND_PROPERTIES = frozenset(
    {
        "author",
        "baseModels",
        "cardData",
        "childrenModelCount",
        "config",
        "createdAt",
        "disabled",
        "downloads",
        "downloadsAllTime",
        "evalResults",
        "gated",
        "gguf",
        "inference",
        "inferenceProviderMapping",
        "lastModified",
        "library_name",
        "likes",
        "mask_token",
        "model-index",
        "pipeline_tag",
        "private",
        "resourceGroup",
        "safetensors",
        "sha",
        "siblings",
        "spaces",
        "tags",
        "transformersInfo",
        "trendingScore",
        "usedStorage",
        "widgetData",
    }
)
SORT_KEYS = ("downloads", "likes", "trendingScore", "createdAt", "lastModified")
SAFETENSORS_SINGLE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
_CHUNK = 1 << 20
_RANGE = re.compile(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class ModelRecord:
    """One repository the server knows: its listing fields, access rules and files.

    Attributes:
        id: repo id, ``org/name`` (or a legacy single-segment name).
        downloads, likes, trending_score: the ranking fields (``trendingScore`` may be None).
        pipeline_tag, library_name: as on the Hub; None leaves them out of the JSON.
        tags: the repo's tags; ``filter=`` matches against these.
        created_at, last_modified: ISO timestamps in the Hub's ``...000Z`` form.
        gated: False, ``"auto"`` or ``"manual"``; gated files need a token in ``HubServer.tokens``.
        private: private repos are invisible to requests without an accepted token.
        sha: the commit every revision ``main`` resolves to; derived from ``id`` when empty.
        tensors: ``{name: (dtype, shape)}``; served as safetensors files with a real header.
        shards: how many ``model-0000i-of-0000n.safetensors`` files the tensors are split over;
            1 serves a single ``model.safetensors``, more add ``model.safetensors.index.json``.
        files: other files of the repo, e.g. ``{"config.json": b"{...}"}``.
        extra: further model-info JSON fields (``config``, ``cardData``...), merged in as given.
    """

    id: str
    downloads: int = 0
    likes: int = 0
    trending_score: float | None = 0
    pipeline_tag: str | None = None
    library_name: str | None = "transformers"
    tags: tuple[str, ...] = ()
    created_at: str = "2025-01-01T00:00:00.000Z"
    last_modified: str = "2025-01-02T00:00:00.000Z"
    gated: bool | str = False
    private: bool = False
    sha: str = ""
    tensors: Mapping[str, tuple[str, Sequence[int]]] = field(default_factory=dict)
    shards: int = 1
    files: Mapping[str, bytes] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def commit(self) -> str:
        return self.sha or hashlib.sha1(self.id.encode()).hexdigest()

    def parameters(self) -> dict[str, int]:
        """Elements per dtype over all tensors, the Hub's ``safetensors.parameters``."""
        counts: dict[str, int] = {}
        for dtype, shape in self.tensors.values():
            counts[dtype] = counts.get(dtype, 0) + math.prod(shape)
        return counts

    def repo_files(self) -> dict[str, Blob]:
        """Every file of the repo by path; safetensors files are built from ``tensors``."""
        blobs = {name: Blob(content) for name, content in self.files.items()}
        if not self.tensors:
            return blobs
        if self.shards <= 1:
            blobs[SAFETENSORS_SINGLE] = safetensors_blob(self.tensors)
            return blobs
        names = list(self.tensors)
        per_shard = max(1, math.ceil(len(names) / self.shards))
        weight_map: dict[str, str] = {}
        total = 0
        for index in range(self.shards):
            shard = f"model-{index + 1:05d}-of-{self.shards:05d}.safetensors"
            chunk = {name: self.tensors[name] for name in names[index * per_shard : (index + 1) * per_shard]}
            blob = safetensors_blob(chunk)
            blobs[shard] = blob
            total += blob.size - blob.data_start
            weight_map.update(dict.fromkeys(chunk, shard))
        index_doc = {"metadata": {"total_size": total}, "weight_map": weight_map}
        blobs[SAFETENSORS_INDEX] = Blob(json.dumps(index_doc, indent=2).encode())
        return blobs

    def info_json(self, blobs: Mapping[str, Blob]) -> dict[str, Any]:
        """The full model-info JSON, as ``GET /api/models/{id}`` returns it."""
        author, _, _ = self.id.rpartition("/")
        info: dict[str, Any] = {
            "_id": hashlib.sha1(self.id.encode()).hexdigest()[:24],
            "id": self.id,
            "modelId": self.id,
            "author": author or None,
            "sha": self.commit,
            "lastModified": self.last_modified,
            "createdAt": self.created_at,
            "private": self.private,
            "gated": self.gated,
            "disabled": False,
            "downloads": self.downloads,
            "likes": self.likes,
            "trendingScore": self.trending_score,
            "library_name": self.library_name,
            "pipeline_tag": self.pipeline_tag,
            "tags": list(self.tags),
            "siblings": [{"rfilename": name} for name in sorted(blobs)],
            "usedStorage": sum(blob.size for blob in blobs.values()),
        }
        if self.tensors:
            parameters = self.parameters()
            info["safetensors"] = {"parameters": parameters, "total": sum(parameters.values())}
        info.update(self.extra)
        # The Hub leaves out what a repo does not have rather than sending nulls.
        return {key: value for key, value in info.items() if value is not None}


class Blob:
    """A file's bytes: a real prefix followed by ``size - len(prefix)`` zero bytes, never materialised."""

    def __init__(self, prefix: bytes, size: int | None = None, data_start: int | None = None) -> None:
        self.prefix = prefix
        self.size = len(prefix) if size is None else size
        # Where the tensor data starts (safetensors); equals size for plain files.
        self.data_start = self.size if data_start is None else data_start
        digest = hashlib.sha256(prefix + str(self.size).encode()).hexdigest()
        self.etag = digest if self.size > len(prefix) else hashlib.sha1(prefix).hexdigest()

    def read(self, start: int, end: int) -> Iterator[bytes]:
        """Bytes ``start`` to ``end`` inclusive, in chunks."""
        position = start
        while position <= end:
            stop = min(end + 1, position + _CHUNK)
            if position < len(self.prefix):
                piece = self.prefix[position : min(stop, len(self.prefix))]
            else:
                piece = bytes(stop - position)
            yield piece
            position += len(piece)


def safetensors_blob(tensors: Mapping[str, tuple[str, Sequence[int]]]) -> Blob:
    """A safetensors file for ``{name: (dtype, shape)}``: real header, zeros for the data."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        length = math.prod(shape) * DTYPE_SIZES[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + length]}
        offset += length
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8-byte alignment with spaces
    prefix = struct.pack("<Q", len(raw)) + raw
    return Blob(prefix, size=len(prefix) + offset, data_start=len(prefix))


@dataclass(frozen=True)
class RecordedRequest:
    """A request the server received.

    Attributes:
        method: ``GET``, ``HEAD``...
        path: the URL path, percent-decoded.
        query: query parameters, each with all its values in order.
        headers: request headers, lower-cased names, without ``authorization``.
        authorized: whether an ``Authorization`` header was sent (its value is never kept).
        authorization_sha256: the SHA-256 of that header's value, so a test can check which
            token was sent without the server keeping it.
    """

    method: str
    path: str
    query: Mapping[str, tuple[str, ...]]
    headers: Mapping[str, str]
    authorized: bool
    authorization_sha256: str | None = None

    def param(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[-1] if values else None


class HubServer:
    """The loopback Hub; a context manager that starts and stops it. Knobs may change while it runs.

    Attributes:
        models: the repositories served, in the order ties keep when sorting.
        tokens: bearer tokens granted access to private and gated repos.
        page_size: most entries per ``/api/models`` page (the Hub's is 1000).
        fail_with: if set, requests under ``fail_path`` answer this status with ``fail_message``.
        fail_count: how many requests fail before the server recovers (None: all of them).
        fail_path: the path prefix ``fail_with`` applies to.
        fail_every: fail only every n-th of those requests (1: each; 2: every other one, a flaky Hub).
        retry_after: if set, failures carry ``Retry-After`` with this many seconds.
        delay_s: every answer waits this long first (``math.inf``: until heal() or stop()).
        requests: every request received, in order (see :class:`RecordedRequest`).
    """

    def __init__(self, models: Sequence[ModelRecord] = (), *, tokens: Sequence[str] = (), port: int = 0) -> None:
        self.models: list[ModelRecord] = list(models)
        # 0 picks a free ephemeral port; a given one lets a test bring back an endpoint it closed.
        self._bind_port = port
        self.tokens: set[str] = set(tokens)
        self.page_size = 1000
        self.fail_with: int | None = None
        self.fail_count: int | None = None
        self.fail_path = "/"
        self.fail_every = 1
        self._fail_seen = 0
        self.fail_message = "Internal Error - We're working hard to fix this as soon as possible!"
        self.retry_after: int | None = None
        self._delay_s = 0.0
        self._requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        # Set to wake every delayed answer at once (heal() and stop() do).
        self._released = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ---

    def start(self) -> HubServer:
        if self._httpd is not None:
            raise RuntimeError("HubServer already started")
        self._released.clear()
        httpd = ThreadingHTTPServer(("127.0.0.1", self._bind_port), _Handler)
        httpd.hub = self  # type: ignore[attr-defined]
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="hub-server", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        # Release delayed answers first, so a client still waiting gets its answer and ends
        # instead of retrying against a closed port.
        self.heal()
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("HubServer is not running")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """The endpoint to put in ``HF_ENDPOINT``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def delay_s(self) -> float:
        """Seconds every answer waits before it is made (``math.inf``: until heal() or stop())."""
        return self._delay_s

    @delay_s.setter
    def delay_s(self, seconds: float) -> None:
        self._delay_s = seconds
        if seconds > 0:
            self._released.clear()

    def heal(self) -> None:
        """Answer normally from now on: no failures, no delay, and delayed answers released now.

        A client abandoned at a test's deadline keeps retrying in the background; healing the
        server lets its next retry succeed so it ends before the test does.
        """
        with self._lock:
            self.fail_with = None
            self.fail_count = None
        self._delay_s = 0.0
        self._released.set()

    def env(self) -> dict[str, str]:
        """Environment overrides for a subprocess whose client should talk to this server."""
        return {"HF_ENDPOINT": self.url, "HF_HUB_OFFLINE": "0"}

    # --- recorded requests ---

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    def requests_to(self, prefix: str) -> list[RecordedRequest]:
        return [request for request in self.requests if request.path.startswith(prefix)]

    def clear_requests(self) -> None:
        with self._lock:
            self._requests.clear()

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(request)

    def _take_failure(self, path: str) -> int | None:
        """The status to fail this request with, counting it against ``fail_count``."""
        with self._lock:
            if self.fail_with is None or not path.startswith(self.fail_path):
                return None
            self._fail_seen += 1
            if self._fail_seen % self.fail_every:
                return None
            if self.fail_count is not None:
                if self.fail_count <= 0:
                    return None
                self.fail_count -= 1
            return self.fail_with

    def _wait(self) -> None:
        delay = self._delay_s
        if delay > 0:
            self._released.wait(None if math.isinf(delay) else delay)

    def find(self, repo_id: str) -> ModelRecord | None:
        for model in self.models:
            if model.id == repo_id:
                return model
        return None


class _Answer(Exception):
    """An error answer in the Hub's shape, raised from a route and written by the handler."""

    def __init__(
        self, status: int, message: str, code: str | None = None, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.headers = dict(headers or {})


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.0: one request per connection, so the client's pool never keeps a connection to a
    # server a previous test already stopped.
    protocol_version = "HTTP/1.0"
    server_version = "hubserver"
    # Set per request by _serve: whether an Authorization header came, and whether its token is accepted.
    _token_sent = False
    _token_ok = False

    @property
    def hub(self) -> HubServer:
        hub: HubServer = self.server.hub  # type: ignore[attr-defined]
        return hub

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: the recorded requests say what happened, pytest's output stays clean."""

    def do_GET(self) -> None:
        self._serve(body=True)

    def do_HEAD(self) -> None:
        self._serve(body=False)

    # --- dispatch ---

    def _serve(self, *, body: bool) -> None:
        parts = urlsplit(self.path)
        path = unquote(parts.path)
        query = {key: tuple(values) for key, values in parse_qs(parts.query, keep_blank_values=True).items()}
        authorization = self.headers.get("Authorization")
        headers = {key.lower(): value for key, value in self.headers.items() if key.lower() != "authorization"}
        digest = None if authorization is None else hashlib.sha256(authorization.encode()).hexdigest()
        self.hub._record(RecordedRequest(self.command, path, query, headers, authorization is not None, digest))
        self.hub._wait()
        token = None
        if authorization and authorization.lower().startswith("bearer "):
            token = authorization[7:].strip()
        self._token_sent = authorization is not None
        self._token_ok = token is not None and token in self.hub.tokens
        try:
            failure = self.hub._take_failure(path)
            if failure is not None:
                extra = {} if self.hub.retry_after is None else {"Retry-After": str(self.hub.retry_after)}
                raise _Answer(failure, self.hub.fail_message, headers=extra)
            self._route(parts.path, query, body=body)
        except _Answer as answer:
            self._send_json(answer.status, {"error": answer.message}, body=body, code=answer.code, extra=answer.headers)

    def _route(self, raw_path: str, query: Mapping[str, tuple[str, ...]], *, body: bool) -> None:
        # Split on the raw path: a revision or file name may contain percent-encoded slashes.
        if raw_path == "/api/models":
            self._list_models(query, body=body)
            return
        if raw_path.startswith("/api/models/"):
            rest = raw_path[len("/api/models/") :]
            if "/safetensors-metadata/" in rest:
                repo_id, _, filename = rest.partition("/safetensors-metadata/")
                self._sharded_metadata(unquote(repo_id), unquote(filename), body=body)
                return
            revision = None
            if "/revision/" in rest:
                rest, _, revision = rest.partition("/revision/")
                revision = unquote(revision)
            self._model_info(unquote(rest), revision, query, body=body)
            return
        if "/resolve/" in raw_path:
            repo_id, _, tail = raw_path.lstrip("/").partition("/resolve/")
            revision, _, filename = tail.partition("/")
            self._resolve(unquote(repo_id), unquote(revision), unquote(filename), body=body)
            return
        raise _Answer(404, "Sorry, we can't find the page you are looking for.")

    # --- routes ---

    def _list_models(self, query: Mapping[str, tuple[str, ...]], *, body: bool) -> None:
        def one(name: str) -> str | None:
            values = query.get(name)
            return values[-1] if values else None

        models = [model for model in self.hub.models if not model.private or self._token_ok]
        if (tag := one("pipeline_tag")) is not None:
            models = [model for model in models if model.pipeline_tag == tag]
        if (author := one("author")) is not None:
            models = [model for model in models if model.id.startswith(f"{author}/")]
        if (search := one("search")) is not None:
            models = [model for model in models if search.lower() in model.id.lower()]
        for wanted in query.get("filter", ()):
            models = [m for m in models if wanted in m.tags or wanted in (m.pipeline_tag, m.library_name)]
        if (gated := one("gated")) is not None:
            want_gated = gated.lower() == "true"
            models = [model for model in models if bool(model.gated) == want_gated]
        if (sort := one("sort")) is not None:
            if sort not in SORT_KEYS:
                raise _Answer(400, f'"sort" must be one of [{", ".join(SORT_KEYS)}]')
            descending = one("direction") != "1"
            models = sorted(models, key=lambda model: _sort_value(model, sort), reverse=descending)
        limit_text = one("limit")
        try:
            limit = int(limit_text) if limit_text is not None else None
            offset = int(one("cursor") or 0)
        except ValueError as exc:
            raise _Answer(400, f"invalid limit or cursor: {exc}") from None
        if limit is not None and limit < 1:
            raise _Answer(400, '"limit" must be greater than or equal to 1')
        fields = _listing_fields(query)
        page_size = min(limit, self.hub.page_size) if limit is not None else self.hub.page_size
        page = models[offset : offset + page_size]
        entries = []
        for model in page:
            info = model.info_json(model.repo_files())
            entries.append({key: info[key] for key in fields if key in info})
        link = {}
        if offset + page_size < len(models):
            next_query = [(key, value) for key, values in query.items() if key != "cursor" for value in values]
            next_query.append(("cursor", str(offset + page_size)))
            link["Link"] = f'<{self._base()}/api/models?{urlencode(next_query)}>; rel="next"'
        self._send_json(200, entries, body=body, extra=link)

    def _model_info(
        self, repo_id: str, revision: str | None, query: Mapping[str, tuple[str, ...]], *, body: bool
    ) -> None:
        model = self._visible(repo_id)
        self._check_revision(model, revision)
        info = model.info_json(model.repo_files())
        expand = _expand(query)
        if expand:
            info = {key: info[key] for key in ("_id", "id", *expand) if key in info}
        self._send_json(200, info, body=body)

    def _sharded_metadata(self, repo_id: str, filename: str, *, body: bool) -> None:
        model = self._visible(repo_id)
        self._check_access(model)
        blobs = model.repo_files()
        index_blob = blobs.get(filename)
        if index_blob is None:
            raise _Answer(404, "Entry not found", "EntryNotFound")
        index = json.loads(index_blob.prefix)
        headers = {}
        for shard in sorted(set(index.get("weight_map", {}).values())):
            prefix = blobs[shard].prefix
            headers[shard] = json.loads(prefix[8:])
        # The Hub leaves the weight_map out: it repeats the tensor names of the shard headers.
        summary = {key: value for key, value in index.items() if key != "weight_map"}
        self._send_json(200, {"index": summary, "headers": headers}, body=body)

    def _resolve(self, repo_id: str, revision: str, filename: str, *, body: bool) -> None:
        model = self._visible(repo_id)
        self._check_revision(model, revision)
        self._check_access(model)
        blob = model.repo_files().get(filename)
        commit = {"X-Repo-Commit": model.commit}
        if blob is None:
            raise _Answer(404, "Entry not found", "EntryNotFound", headers=commit)
        start, end = 0, blob.size - 1
        status = 200
        range_header = self.headers.get("Range")
        extra = {**commit, "ETag": f'"{blob.etag}"', "Accept-Ranges": "bytes"}
        if range_header:
            match = _RANGE.match(range_header)
            unsatisfiable = {"Content-Range": f"bytes */{blob.size}"}
            if match is None:
                raise _Answer(416, f"unsupported range {range_header!r}", headers=unsatisfiable)
            first, last = match.groups()
            if first:
                start = int(first)
                end = min(int(last), blob.size - 1) if last else blob.size - 1
            elif last:
                start, end = max(0, blob.size - int(last)), blob.size - 1
            if start >= blob.size or start > end:
                raise _Answer(416, "Requested Range Not Satisfiable", headers=unsatisfiable)
            status = 206
            extra["Content-Range"] = f"bytes {start}-{end}/{blob.size}"
        content_type = "application/json" if filename.endswith(".json") else "application/octet-stream"
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(end - start + 1))
        for key, value in extra.items():
            self.send_header(key, value)
        self.end_headers()
        if body:
            for piece in blob.read(start, end):
                self.wfile.write(piece)

    # --- access rules ---

    def _visible(self, repo_id: str) -> ModelRecord:
        model = self.hub.find(repo_id)
        if model is None or (model.private and not self._token_ok):
            if model is not None and not self._token_sent:
                # What the Hub answers an anonymous caller about a private repo.
                raise _Answer(401, "Invalid username or password.", "RepoNotFound")
            raise _Answer(404, "Repository not found", "RepoNotFound")
        return model

    def _check_revision(self, model: ModelRecord, revision: str | None) -> None:
        if revision is not None and revision not in ("main", model.commit):
            raise _Answer(404, f"Invalid rev id: {revision}", "RevisionNotFound")

    def _check_access(self, model: ModelRecord) -> None:
        """Gated repos: metadata is public, files need a token the server accepts."""
        if not model.gated or self._token_ok:
            return
        if self._token_sent:
            raise _Answer(
                403,
                f"Access to model {model.id} is restricted and you are not in the authorized list. "
                f"Visit {self._base()}/{model.id} to ask for access.",
                "GatedRepo",
            )
        raise _Answer(
            401,
            f"Access to model {model.id} is restricted. You must have access to it and be authenticated to access it. "
            "Please log in.",
            "GatedRepo",
        )

    # --- writing ---

    def _base(self) -> str:
        host = self.headers.get("Host") or f"127.0.0.1:{self.server.server_address[1]}"
        return f"http://{host}"

    def _send_json(
        self,
        status: int,
        payload: Any,
        *,
        body: bool,
        code: str | None = None,
        extra: Mapping[str, str] | None = None,
    ) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        if code is not None:
            self.send_header("X-Error-Code", code)
        if status >= 400 and isinstance(payload, dict) and "error" in payload:
            self.send_header("X-Error-Message", str(payload["error"]))
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if body:
            self.wfile.write(data)


def _sort_value(model: ModelRecord, key: str) -> Any:
    if key == "downloads":
        return model.downloads
    if key == "likes":
        return model.likes
    if key == "trendingScore":
        return model.trending_score or 0
    if key == "createdAt":
        return model.created_at
    return model.last_modified


def _expand(query: Mapping[str, tuple[str, ...]]) -> list[str]:
    # The client sends repeated ``expand=``; the Hub also documents ``expand[]=``.
    expand = [*query.get("expand", ()), *query.get("expand[]", ())]
    unknown = [value for value in expand if value not in EXPAND_PROPERTIES]
    if unknown:
        raise _Answer(400, f'"expand" must be one of [{", ".join(sorted(EXPAND_PROPERTIES))}] (got {unknown})')
    return expand


def _listing_fields(query: Mapping[str, tuple[str, ...]]) -> tuple[str, ...]:
    expand = _expand(query)
    if expand:
        return ("_id", "id", *expand)
    full = (query.get("full") or ("",))[-1].lower() in ("1", "true")
    fields = LIST_FIELDS + FULL_FIELDS if full else LIST_FIELDS
    if (query.get("cardData") or ("",))[-1].lower() in ("1", "true"):
        fields += ("cardData",)
    if (query.get("config") or ("",))[-1].lower() in ("1", "true"):
        fields += ("config",)
    return fields
