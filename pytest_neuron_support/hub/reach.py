"""Asking the Hub at all: which endpoint, whether it can be reached, a call under a deadline, and an
error text fit to show (a failed call described in one paragraph, scrubbed of tokens and credentials).

The rankings (:mod:`.rankings`) and the file questions (:mod:`.files`) ask through these.
``huggingface_hub`` is imported inside the functions that use it, so importing this module stays cheap.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from pytest_neuron_support.base.redaction import scrub

# Seconds to open a connection to the Hub before it counts as unreachable: a refused port or a
# failed DNS lookup answers at once; a network that drops packets is given this long.
REACH_TIMEOUT_S = 3.0

# User access tokens start with "hf_"; anything shaped like one is scrubbed from error texts even
# when it is not the token we were given (the client may have picked one up from HF_TOKEN).
_TOKEN_PATTERN = re.compile(r"hf_[A-Za-z0-9]{16,}")
# The "user:password@" of a URL quoted in an error text (the client logs full URLs).
_USERINFO_PATTERN = re.compile(r"//[^/@\s]+@")

_T = TypeVar("_T")


class HubError(Exception):
    """What the Hub (or a snapshot of its answers) gave is not what it should be: a malformed or
    unsupported snapshot, a dict meant to become a ranking, a download that returned no file."""


def hub_endpoint() -> str:
    """The endpoint the client should ask: ``HF_ENDPOINT`` as set now, else the client's default.

    The client's default (``huggingface_hub.constants.ENDPOINT``) is read from ``HF_ENDPOINT`` at
    import time, so it is only the fallback: a test or a CLI run that sets the variable later
    still gets the server it named.
    """
    from huggingface_hub import constants

    configured = os.environ.get("HF_ENDPOINT", "").strip().rstrip("/")
    return configured or str(constants.ENDPOINT)


def offline() -> bool:
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
    if offline():
        return "HF_HUB_OFFLINE=1"
    endpoint = hub_endpoint()
    parts = urlsplit(endpoint)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        return f"{without_credentials(endpoint)} is unreachable ({reason})"
    return None


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


def with_deadline(call: Callable[[], _T], timeout_s: float, what: str) -> _T:
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


def describe(exc: BaseException) -> str:
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


def scrub_token(text: str, token: str | None) -> str:
    if token:
        text = text.replace(token, "***")
    # token=None lets the client send HF_TOKEN (or another secret variable) itself: mask those values
    # too, whatever their shape (the pattern below knows only user tokens, hf_...).
    text = scrub(text) or ""
    text = _USERINFO_PATTERN.sub("//", text)
    return _TOKEN_PATTERN.sub("hf_***", text)


def without_credentials(url: str) -> str:
    """``url`` without any ``user:password@`` part (an HF_ENDPOINT proxy URL may carry one)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port is not None else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _without_query(url: str) -> str:
    parts = urlsplit(without_credentials(url))
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return text.strip()
