"""The meter step of an outbound call: one response's usage reader, its report, its amount.

``Metering.start`` describes the response to the usage side (``reader_for_response``, once)
and puts a ``FuseReport`` in its extensions; the ``Meter`` it returns is fed the body (at once
when the response came back already read, else by the stream wrapper as chunks pass) and
settled exactly once. No I/O here: recording the amount is the transports' own settle step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._events import logger
from .._fuse import Decision
from .._identity import Identity
from .._observe import WATCHERS, CallFacts, call_facts, metered
from .._usage import (
    ExtractorRegistry,
    ResponseHead,
    Usage,
    UsageReader,
    default_registry,
    reader_for_response,
)

__all__ = ["EXTENSION", "FuseReport", "Meter", "Metering", "log_once"]

#: The key of the ``FuseReport`` in ``response.extensions`` (and of per-request options in
#: ``request.extensions``: ``{"tokenfuse": {"key": "agent-7"}}``).
EXTENSION = "tokenfuse"

_MAX_LOGGED = 256
_UNKNOWN = "unknown"
_logged: set[tuple[str, str]] = set()


def log_once(provider: str, problem: str, exc: BaseException | None = None) -> None:
    """Log a usage problem the first time it is seen in this process.

    A provider that never sends usage (an OpenAI stream without ``include_usage``) would
    otherwise log on every call. The set is bounded: problems past the first few hundred
    distinct ones are no longer logged at all.
    """
    marker = (provider, problem)
    if marker in _logged or len(_logged) >= _MAX_LOGGED:
        return
    _logged.add(marker)
    logger.log(
        logging.WARNING,
        "tokenfuse could not count the tokens of a response (provider: %s): %s. It is recorded "
        "as unknown; further occurrences are not logged.",
        provider,
        problem,
        exc_info=exc,
    )


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
            ``usage.total is None`` means the amount is unknown (nothing was recorded).
        record: the decision of recording the usage; ``None`` when nothing was recorded
            (unknown usage, a count of 0, or not finished yet).
        done: the response has been read or closed and its usage settled.
    """

    identity: Identity
    gate: Decision
    usage: Usage | None = None
    record: Decision | None = None
    done: bool = False

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
    one is logged once and leaves the call's usage unknown.
    """

    __slots__ = ("_failure", "_reader", "call", "identity", "report", "streaming")

    def __init__(self, identity: Identity, report: FuseReport) -> None:
        self.identity = identity
        self.report = report
        self._reader: UsageReader | None = None
        self._failure: str | None = None
        self.streaming = False  # a reader waits for the body, which is still to be streamed
        self.call: CallFacts | None = None  # model and operation, read when usage is observed

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

    def feeder(self) -> Callable[[bytes], None]:
        """What a stream calls with every chunk: the reader's own ``feed``, no layer between."""
        reader = self._reader
        return reader.feed if reader is not None else _ignore

    def finish(self, *, complete: bool) -> float | None:
        """End the reading: the amount to record, or None (nothing to record, or done before)."""
        report = self.report
        if report.done:
            return None
        report.done = True
        usage = self._usage(complete)
        report.usage = usage
        if usage is None:
            return None
        if self.call is not None and usage.known and WATCHERS.usage:
            metered(WATCHERS.usage, self.identity, usage, self.call)
        if usage.problem is not None and not usage.counts_nothing:
            log_once(usage.provider, usage.problem)
        total = usage.total
        return total if total is not None and total > 0 else None

    def fail(self, exc: Exception) -> None:
        """Choosing a reader failed: log once, read nothing, report unknown."""
        self._reader = None
        self._failure = f"usage reader failed: {type(exc).__name__}"
        log_once(_UNKNOWN, self._failure, exc)

    def _usage(self, complete: bool) -> Usage | None:
        reader = self._reader
        if reader is None:
            if self._failure is None:
                return None  # not an LLM call: nothing was read
            return Usage.unknown(_UNKNOWN, self._failure, partial=not complete)
        self._reader = None
        return reader.finish(complete=complete)


def _ignore(chunk: bytes) -> None:
    pass


class Metering:
    """How a transport meters its responses: where their readers come from, and ``estimate``."""

    __slots__ = ("estimate", "registry")

    def __init__(self, registry: ExtractorRegistry | None, estimate: bool) -> None:
        self.registry = registry if registry is not None else default_registry
        self.estimate = estimate

    def start(self, request: Any, response: Any, identity: Identity, gate: Decision) -> Meter:
        """The meter of one response, whose report it puts in the response's extensions.

        A response can come back from the inner transport already read (``MockTransport`` with
        ``content=``, a caching transport): the client will not iterate its stream, so the
        body is read from memory, where it is already decoded.
        """
        meter = Meter(identity, FuseReport(identity, gate))
        if WATCHERS.usage:  # metrics: the model and operation of the call, for their labels
            meter.call = call_facts(request)
        body = _body_if_read(response)
        try:
            reader = self._reader_for(request, response, decoded=body is not None)
        except Exception as exc:  # a custom registry: its failure must not break the call
            meter.fail(exc)
        else:
            meter.read_with(reader, body)
        response.extensions[EXTENSION] = meter.report
        return meter

    def _reader_for(self, request: Any, response: Any, *, decoded: bool) -> UsageReader | None:
        # `decoded`: the client already decoded the body, so its content-encoding is no more.
        headers = _header_dict(response.headers)
        if decoded:
            headers.pop("content-encoding", None)
        url = request.url
        try:
            head = ResponseHead(
                method=request.method.upper(),
                url=url,
                host=url.raw_host.decode("ascii").lower(),  # as `urlsplit(...).hostname`
                # Still %-encoded, as sent; "/" for an empty path (no route tells them apart).
                path=url.raw_path.decode("ascii").partition("?")[0],
                status_code=int(response.status_code),
                request_headers=request.headers,
                response_headers=headers,
                estimate=self.estimate,
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


def _header_dict(headers: Any) -> dict[str, str]:
    """``dict(headers.items())`` of an httpx ``Headers``, in a fraction of its time.

    The same dict: names lower-cased, repeated ones joined with ``", "``, both decoded with the
    headers' encoding. ``items()`` looks that encoding up twice per header; a dict is what the
    usage readers want (two or three lookups, each a scan of the list in ``Headers``).
    """
    encoding = headers.encoding
    found: dict[str, str] = {}
    for name, value in headers.raw:
        key = name.lower().decode(encoding)
        text = value.decode(encoding)
        found[key] = f"{found[key]}, {text}" if key in found else text
    return found
