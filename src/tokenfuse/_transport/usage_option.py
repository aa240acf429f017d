"""Asking OpenAI-style streams for their usage on the caller's behalf (``inject_usage``).

A chat/completions (or legacy completions) stream reports no usage unless its request says
``"stream_options": {"include_usage": true}``, and many callers never say it (LangChain's
``ChatOpenAI`` turns it off whenever it is given an ``http_client``). Such a call would be
counted as nothing, so the transport adds the option to the JSON body of a streaming request
that goes without it (``tokenfuse._usage.request``): everything else in the body is kept, and
the stream gains one final chunk with empty ``choices`` and the usage, which the SDKs expect.

A server that validates fields strictly may refuse the option. When the answer is a 400 (or
422) whose body names it, nothing was generated: the request is sent again as the caller made
it, and the host is remembered (the most recent ``MAX_HOSTS``, for the process) as one not to
ask again; its streams are then counted by estimate. Each refusal is counted in
``fuse.stats.usage_option_refused`` and logged the first time per host.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

from .._events import logger
from .._fuse import Fuse
from .._usage.providers import takes_usage_option
from .._usage.request import refuses_usage_option, streams_without_usage, with_usage_option
from .compat import Flavor

__all__ = ["MAX_HOSTS", "Sending", "UsageOption", "sent_body"]

#: Hosts remembered as refusing the option; past this, the least recently refused is forgotten.
MAX_HOSTS = 1024
_REFUSING_STATUSES = (400, 422)  # 422: FastAPI-based servers (vLLM, ...) on an extra field

_refusing: dict[str, None] = {}  # host:port, least recently refused first
_lock = threading.Lock()


class Sending(NamedTuple):
    """One request as the transport sends it (a tuple: one is made for every call).

    Attributes:
        request: what goes to the inner transport.
        original: the request as the caller made it.
        asked: the usage option was added to ``request``.
        count_text: the response is a stream that will report no usage: its generated text is
            counted for an estimate.
    """

    request: Any
    original: Any
    asked: bool = False
    count_text: bool = False

    def as_made(self) -> Sending:
        """The original request, sent again after the option was refused."""
        return Sending(self.original, self.original, asked=False, count_text=True)


def _host(url: Any) -> str:
    return f"{url.raw_host.decode('ascii').lower()}:{url.port or ''}"


def sent_body(request: Any) -> bytes | None:
    """The body ``request`` sends, or None when it is streamed (not kept in memory)."""
    try:
        body = request.content
    except Exception:  # RequestNotRead: a generator or file body
        return None
    return body if isinstance(body, bytes) else None


def _streaming_body(request: Any) -> bytes | None:
    """The JSON body of a POST that may ask for a stream, else None (most requests: a body
    without ``"stream"`` asks for none, and is not looked into further)."""
    if request.method != "POST":
        return None
    body = sent_body(request)
    if body is None or body.find(b'"stream"') < 0 or "content-encoding" in request.headers:
        return None
    return body


def _with_body(request: Any, flavor: Flavor, body: bytes) -> Any:
    headers = request.headers.copy()
    headers["Content-Length"] = str(len(body))
    return flavor.module.Request(
        request.method, request.url, headers=headers, content=body, extensions=request.extensions
    )


class UsageOption:
    """The transport's part: which requests to ask, and what a refusal looks like."""

    __slots__ = ("enabled", "fuse")

    def __init__(self, enabled: bool, fuse: Fuse) -> None:
        self.enabled = enabled
        self.fuse = fuse  # counts in ``fuse.stats``

    def prepare(self, request: Any, flavor: Flavor) -> Sending:
        """The request to send: ``request`` itself, or a copy that asks for its usage.

        Never raises: a request this cannot look into is sent as it was made.
        """
        try:
            return self._prepare(request, flavor)
        except Exception:
            return Sending(request, request)

    def _prepare(self, request: Any, flavor: Flavor) -> Sending:
        body = _streaming_body(request)
        if body is None:
            return Sending(request, request)
        url = request.url
        path = url.raw_path.decode("ascii").partition("?")[0]
        if not takes_usage_option(url.raw_host.decode("ascii").lower(), path):
            return Sending(request, request)
        if self.enabled and _host(url) not in _refusing:
            asked = with_usage_option(body)
            if asked is None:  # it asks already, or it is not a stream
                return Sending(request, request)
            sending = Sending(_with_body(request, flavor, asked), request, asked=True)
            self.fuse.stats.asked()
            return sending
        return Sending(request, request, count_text=streams_without_usage(body))

    @staticmethod
    def may_be_refused(sending: Sending, response: Any) -> bool:
        """Whether to read the start of the response's body to see if the option was refused."""
        return sending.asked and response.status_code in _REFUSING_STATUSES

    def refused(self, sending: Sending, response: Any, head: bytes) -> bool:
        """Whether ``head`` (the start of an error body) refuses the option; if so, the host is
        remembered, counted and (the first time) logged."""
        encoding = response.headers.get("content-encoding", "")
        if not refuses_usage_option(head, encoding):
            return False
        host = _host(sending.request.url)
        with _lock:
            known = host in _refusing  # another request of the same host was refused first
            if known:
                del _refusing[host]  # re-inserted last: the most recently refused
            _refusing[host] = None
            if len(_refusing) > MAX_HOSTS:
                del _refusing[next(iter(_refusing))]
        count = self.fuse.stats.option_refused()
        if not known:
            logger.warning(
                "tokenfuse: %s refused stream_options.include_usage (HTTP %s); the request was "
                "sent again as it was made, and streams from this host are no longer asked for "
                "their usage: they are counted by estimate (%d refusal(s) in this fuse so far)",
                host,
                response.status_code,
                count,
            )
        return True
