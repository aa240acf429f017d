"""The meter step of an outbound call: one response's usage reader, its report, its amount.

``Metering.start`` describes the response to the usage side (``reader_for_response``, once)
and puts a ``FuseReport`` in its extensions; the ``Meter`` it returns is fed the body (at once
when the response came back already read, else by the stream wrapper as chunks pass) and
settled exactly once. When the response reported no usage, the settled amount is an estimate
(``estimate``, on by default: the request's text plus the generated text, see
``tokenfuse._usage.estimate``), and calls not counted whole are told to ``fuse.stats``
(``account``). No I/O here: recording the amount is the transports' own settle step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

from .._events import logger
from .._fuse import Decision, Fuse
from .._identity import Identity
from .._observe import WATCHERS, call_facts, metered
from .._usage import (
    ExtractorRegistry,
    ResponseHead,
    Usage,
    UsageReader,
    default_registry,
    reader_for_response,
)
from .._usage.estimate import reported, with_input
from .._usage.readers import FixedReader, FramedReader
from .._usage.scan import ErrorFind
from .account import account
from .compat import Endpoint, endpoint_of, header_entries
from .usage_option import Sending, sent_body

__all__ = ["EXTENSION", "FuseReport", "Meter", "Metering"]

#: The key of the ``FuseReport`` in ``response.extensions`` (and of per-request options in
#: ``request.extensions``: ``{"tokenfuse": {"key": "agent-7"}}``).
EXTENSION = "tokenfuse"

_UNKNOWN = "unknown"
_failures_logged: set[str] = set()


def _log_failure(exc: Exception) -> None:
    """Log the traceback of a failing registry, once per kind of exception in this process."""
    name = type(exc).__name__
    if name in _failures_logged or len(_failures_logged) >= 64:
        return
    _failures_logged.add(name)
    logger.warning("tokenfuse: choosing a usage reader failed", exc_info=exc)


@dataclass(slots=True, eq=False)
class FuseReport:
    """What the transport did with one call, in ``response.extensions["tokenfuse"]``.

    A streamed response is returned before its body is read: ``usage`` and ``record`` are
    filled in when the stream ends or is closed (``done`` turns True).

    >>> report = response.extensions["tokenfuse"]        # doctest: +SKIP
    >>> report.key, report.usage.total, report.decision.rate  # doctest: +SKIP
    ('sk-…a1b2', 1234.0, 5821.0)
    >>> fuse.status(report.identity).rate                  # doctest: +SKIP
    5821.0

    Attributes:
        identity: who the call was counted for (``fuse.status(report.identity)``);
            ``key`` is its redacted label.
        gate: the decision taken before sending (always allowed here: a refusal raises).
        usage: the tokens read from the response; ``None`` while a stream is still being read
            and for responses that are not LLM calls (no reader matched them).
            ``usage.estimated`` means the response reported none and the amount recorded is
            an estimate; ``usage.total is None`` means it is unknown (nothing was recorded).
        record: the decision of recording the usage; ``None`` when nothing was recorded
            (unknown usage, a count of 0, or not finished yet).
        done: the response has been read or closed and its usage settled.
        asked_usage: the transport added ``stream_options.include_usage`` to the request, so
            the stream ends with a usage chunk the caller did not ask for.
    """

    identity: Identity
    gate: Decision
    usage: Usage | None = None
    record: Decision | None = None
    done: bool = False
    asked_usage: bool = False

    @property
    def key(self) -> str:
        """The redacted label of the identity (``sk-…a1b2``, ``agent-42``)."""
        return self.identity.label

    @property
    def decision(self) -> Decision:
        """The latest decision: the record's once made, else the gate's."""
        return self.record if self.record is not None else self.gate

    @property
    def tripped(self) -> bool:
        """This call's usage opened the key: the next call from it will be refused."""
        return self.record is not None and self.record.tripped


class Meter:
    """Feeds one response's body to its usage reader and settles the result exactly once.

    Nothing here raises: the usage side's readers never do, and a registry that fails to choose
    one is logged and leaves the call's usage unknown.
    """

    __slots__ = ("_failure", "_metering", "_reader", "_request", "identity", "report", "streaming")

    def __init__(
        self, metering: Metering, request: Any, identity: Identity, report: FuseReport
    ) -> None:
        self._metering = metering
        self._request = request  # its body is read only for an estimate
        self.identity = identity
        self.report = report
        self._reader: UsageReader | None = None
        self._failure: str | None = None
        self.streaming = False  # a reader waits for the body, which is still to be streamed

    def read_with(self, reader: UsageReader | None, body: bytes | None) -> None:
        """Read with ``reader``: ``body`` at once if the response came back already read, else
        the chunks of its stream as they pass (``streaming``)."""
        self._reader = reader
        if reader is None:
            return
        if body is None:
            self.streaming = True
        else:
            reader.feed(body)

    def stream_reader(self) -> Callable[[bytes], None] | None:
        """What a stream shows its body to, a batch of chunks at a time (any reader takes a body
        in pieces cut anywhere). None when nothing reads it: no reader, or one whose answer
        came with the headers."""
        reader = self._reader
        if reader is None or isinstance(reader, FixedReader):
            return None
        return reader.feed

    def share_errors(self, errors: ErrorFind) -> None:
        """The stream reader searches for errors through ``errors`` (a search the failure-loop
        watch shares): a reader that does not search (not framed) leaves it alone."""
        reader = self._reader
        if isinstance(reader, FramedReader):
            reader.share_errors(errors)

    def skipped(self, problem: str) -> None:
        """Part of a streamed body cannot be read (``problem`` says why): the usage read from the
        rest is partial. (Any other reader learns it from the settle: not complete.)"""
        reader = self._reader
        if isinstance(reader, FramedReader):
            reader.skipped(problem)

    def finish(self, *, complete: bool) -> float | None:
        """End the reading: the amount to record, or None (nothing to record, or done before)."""
        report = self.report
        if report.done:
            return None
        report.done = True
        usage = self._usage(complete)
        metering = self._metering
        if usage is not None and metering.estimate and not reported(usage):
            usage = with_input(usage, sent_body(self._request))
        report.usage = usage
        account(metering.fuse, self.identity, usage, estimating=metering.estimate)
        if usage is not None and usage.known and WATCHERS.usage:  # metrics, when observed
            metered(WATCHERS.usage, self.identity, usage, call_facts(self._request))
        total = usage.total if usage is not None else None
        return total if total is not None and total > 0 else None

    def fail(self, exc: Exception) -> None:
        """Choosing a reader failed: log it, read nothing, report unknown."""
        self._reader = None
        self._failure = f"usage reader failed: {type(exc).__name__}"
        _log_failure(exc)

    def _usage(self, complete: bool) -> Usage | None:
        reader = self._reader
        if reader is None:
            if self._failure is None:
                return None  # not an LLM call: nothing was read
            return Usage.unknown(_UNKNOWN, self._failure, partial=not complete)
        self._reader = None
        return reader.finish(complete=complete)


class Metering:
    """How a transport meters its responses: where their readers come from, whether unknown
    usage is estimated, and the fuse whose stats count what was not read whole."""

    __slots__ = ("estimate", "fuse", "registry")

    def __init__(self, fuse: Fuse, registry: ExtractorRegistry | None, estimate: bool) -> None:
        self.fuse = fuse
        self.registry = registry if registry is not None else default_registry
        self.estimate = estimate

    def start(
        self,
        sent: Sending,
        response: Any,
        identity: Identity,
        gate: Decision,
        where: Endpoint | None = None,
    ) -> Meter:
        """The meter of the response to ``sent``, whose report goes in the response's extensions.

        A stream that will report no usage (``sent.count_text``) has its generated text
        counted as it passes, for an estimate; other streams do without that work.

        A response can come back from the inner transport already read (``MockTransport`` with
        ``content=``, a caching transport): the client will not iterate its stream, so the
        body is read from memory, where it is already decoded.

        ``where``: the request's endpoint, when the transport has read it (``endpoint_of``).
        """
        request = sent.request
        report = FuseReport(identity, gate, asked_usage=sent.asked)
        meter = Meter(self, request, identity, report)
        body = _body_if_read(response)
        try:
            reader = self._reader_for(
                request, response, where, decoded=body is not None, count_text=sent.count_text
            )
        except Exception as exc:  # a custom registry: its failure must not break the call
            meter.fail(exc)
        else:
            meter.read_with(reader, body)
        response.extensions[EXTENSION] = meter.report
        return meter

    def _reader_for(
        self, request: Any, response: Any, where: Endpoint | None, *, decoded: bool,
        count_text: bool,
    ) -> UsageReader | None:  # fmt: skip
        # `decoded`: the client already decoded the body, so its content-encoding is no more.
        headers = _ResponseHeaders(response.headers, decoded=decoded)
        url = request.url
        if where is None:
            where = endpoint_of(url)
            if where is None:
                return None  # as `reader_for` does with a response it cannot describe
        try:
            head = ResponseHead(
                method=request.method.upper(),
                url=url,
                # The host as `urlsplit(...).hostname`; the path still %-encoded, as sent, "/"
                # for an empty one (no route tells them apart).
                host=where[0],
                path=where[1],
                status_code=int(response.status_code),
                request_headers=request.headers,
                response_headers=headers,
                estimate=self.estimate and count_text,
            )
        except Exception:
            return None  # as `reader_for` does with a response it cannot describe
        return reader_for_response(head, self.registry)


def _body_if_read(response: Any) -> bytes | None:
    """The body of a response that came back already read, or None (not read yet).

    ``response.content`` says the same by raising ``ResponseNotRead``, which every streamed
    response would pay for on every call. Both libraries keep the body that ``content`` returns
    in ``_content``, set only once it is read (``tests/transport`` serve already-read responses
    of both, so a library that stopped doing this would fail there, not pass silently).
    """
    body: bytes | None = getattr(response, "_content", None)
    return body


_MISSING = object()


class _ResponseHeaders(Mapping[str, str]):
    """An httpx response's headers as the usage side reads them: ``dict(headers.items())``
    (names lower-cased, repeated ones joined with ``", "``, both decoded with the headers'
    encoding), less ``content-encoding`` when the client decoded the body already.

    The built-in readers look up two or three names, each found with one pass over the
    library's own list (``header_entries``): cheaper than decoding every header of a real
    response (providers send 15 to 25). Whatever iterates them (a registered extractor's
    ``ResponseInfo``) gets the whole dict, made once.
    """

    __slots__ = ("_decoded", "_dict", "_entries", "_headers")

    def __init__(self, headers: Any, *, decoded: bool) -> None:
        self._headers = headers
        self._entries = header_entries(headers)
        self._decoded = decoded
        self._dict: dict[str, str] | None = None

    def get(self, name: str, default: Any = None) -> Any:
        if self._dict is not None:
            return self._dict.get(name, default)
        if self._decoded and name == "content-encoding":
            return default
        # ASCII is the same bytes in each encoding httpx may choose (ASCII, UTF-8, latin-1),
        # so the headers' encoding, which httpx works out by decoding every header, is only
        # asked for what is not ASCII.
        try:
            wanted = name.encode("ascii" if name.isascii() else self._encoding())
        except UnicodeEncodeError:
            return default  # no header's name decodes to it
        found: str | None = None
        for _, lowered, value in self._entries:
            if lowered == wanted:
                text = value.decode("ascii" if value.isascii() else self._encoding())
                found = text if found is None else f"{found}, {text}"
        return default if found is None else found

    def __getitem__(self, name: str) -> str:
        value = self.get(name, _MISSING)
        if value is _MISSING:
            raise KeyError(name)
        return cast("str", value)

    def __iter__(self) -> Iterator[str]:
        return iter(self._whole())

    def __len__(self) -> int:
        return len(self._whole())

    def _encoding(self) -> str:
        encoding: str = self._headers.encoding
        return encoding

    def _whole(self) -> dict[str, str]:
        if self._dict is None:
            encoding = self._encoding()
            found: dict[str, str] = {}
            for _, lowered, value in self._entries:
                key = lowered.decode(encoding)
                text = value.decode(encoding)
                found[key] = f"{found[key]}, {text}" if key in found else text
            if self._decoded:
                found.pop("content-encoding", None)
            self._dict = found
        return self._dict
