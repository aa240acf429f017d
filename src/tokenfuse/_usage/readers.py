"""Readers: content-coding decoder + framer + accumulator, assembled per response.

`shape_reader` is the one pipeline every built-in provider (and every `ShapeExtractor`) uses;
providers differ only in the `UsageShape` they pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from .accumulator import Accumulator
from .decoding import BodyDecoder, UnsupportedEncoding, make_decoder
from .eventstream import EventStreamFramer
from .jsonbody import JsonBodyFramer
from .lines import NdjsonFramer
from .model import ResponseFacts, Usage, UsageReader, UsageShape
from .scan import ErrorFind
from .sse import SseFramer

INTERNAL_ERROR = "internal error while reading usage"


class Framer(Protocol):
    def feed(self, chunk: bytes) -> None: ...

    def close(self, complete: bool) -> None: ...


FramerFactory = Callable[[Accumulator], Framer]

_NDJSON_TYPES = frozenset(
    {"application/x-ndjson", "application/ndjson", "application/jsonl", "application/x-jsonlines"}
)


def _framer_for(content_type: str) -> FramerFactory | None:
    if content_type == "text/event-stream":
        return SseFramer
    if content_type in _NDJSON_TYPES:
        return NdjsonFramer
    if content_type == "application/vnd.amazon.eventstream":
        return EventStreamFramer
    if content_type in ("application/json", "text/json") or content_type.endswith("+json"):
        return JsonBodyFramer
    return None


class SniffFramer:
    """For a known LLM endpoint whose content-type is missing or wrong: choose the framer from
    the first non-blank byte (`{` or `[` is a JSON body, a field name is SSE)."""

    __slots__ = ("_inner", "_sink")

    def __init__(self, sink: Accumulator) -> None:
        self._sink = sink
        self._inner: Framer | None = None

    def feed(self, chunk: bytes) -> None:
        if self._inner is not None:
            self._inner.feed(chunk)
            return
        head = chunk.lstrip()
        if not head:
            return
        if head[:1] in (b"{", b"["):
            self._sink.streaming = False
            self._inner = JsonBodyFramer(self._sink)
        elif head[:1] in (b"d", b"e", b":", b"i", b"r"):
            self._inner = SseFramer(self._sink)
        else:
            self._sink.stop("unrecognised response body")
            self._inner = _Ignore()
        self._inner.feed(head)

    def close(self, complete: bool) -> None:
        if self._inner is None:
            self._sink.note("empty body")
        else:
            self._inner.close(complete)


class _Ignore:
    def feed(self, chunk: bytes) -> None:
        pass

    def close(self, complete: bool) -> None:
        pass


class DecodingFramer:
    """Decodes a compressed body and hands the decoded pieces to the framer."""

    __slots__ = ("_decoder", "_inner", "_sink")

    def __init__(self, decoder: BodyDecoder, inner: Framer, sink: Accumulator) -> None:
        self._decoder = decoder
        self._inner = inner
        self._sink = sink

    def feed(self, chunk: bytes) -> None:
        decoder = self._decoder
        for piece in decoder.decode(chunk):
            self._inner.feed(piece)
        if decoder.problem is not None:
            self._sink.stop(decoder.problem)  # the decoder yields nothing more from now on

    def close(self, complete: bool) -> None:
        self._inner.close(complete)


#: Body bytes collected before the framer sees them. A stream chunk is mostly one small event
#: (100-500 bytes), and searching a few KiB at once for anything worth reading costs about as
#: much as searching one chunk: handing chunks over in batches divides that work, and the
#: framers do not depend on where chunks begin and end. Bounded, so memory stays small.
BATCH = 4 * 1024


class FramedReader:
    """The standard reader. Exceptions are caught here, once, so that a bug in a framer can
    never break the caller's response; they end reading with a problem.

    Chunks are collected in ``_batch`` and handed to the framer ``BATCH`` bytes at a time
    (a piece as big as that at once: the transport's streams feed a batch of their own).
    """

    __slots__ = ("_acc", "_batch", "_batched", "_feed", "_framer", "_result")

    def __init__(self, framer: Framer, acc: Accumulator) -> None:
        self._framer = framer
        self._acc = acc
        self._feed: Callable[[bytes], None] = framer.feed
        self._batch: list[bytes] = []  # chunks not yet handed to the framer
        self._batched = 0  # their length, as far as `feed` counted it
        self._result: Usage | None = None

    def feed(self, chunk: bytes) -> None:
        # The hot path, once per chunk: no more than remembering it.
        try:
            self._batch.append(chunk)
            self._batched += len(chunk)
        except Exception:
            self._fail()
            return
        if self._batched >= BATCH:
            self.flush()

    def flush(self) -> None:
        """Hand the chunks collected so far to the framer."""
        batch = self._batch
        if not batch:
            return
        try:
            data = b"".join(batch)
            batch.clear()
            self._batched = 0
            self._feed(data)
        except Exception:
            self._fail()

    def share_errors(self, errors: ErrorFind) -> None:
        """Search for errors through ``errors``, which another look at the same batches uses."""
        self._acc.errors = errors

    def skipped(self, problem: str) -> None:
        """Part of the body is never to be fed (``problem`` says why): whatever else it reports
        is read all the same, and the usage is partial."""
        self._acc.stop(problem)

    def _fail(self) -> None:
        self._feed = _ignore
        self._batch.clear()
        self._acc.stop(INTERNAL_ERROR)

    def finish(self, *, complete: bool) -> Usage:
        if self._result is None:
            self.flush()
            try:
                # A body we stopped reading is as incomplete as one the client closed early.
                self._framer.close(complete and not self._acc.cut)
                self._result = self._acc.result(complete=complete)
            except Exception:
                self._result = Usage.unknown(self._acc.provider, INTERNAL_ERROR)
        return self._result


def _ignore(chunk: bytes) -> None:
    pass


class FixedReader:
    """A reader whose answer is known before the body: headers, or nothing to count."""

    __slots__ = ("_usage",)

    def __init__(self, usage: Usage) -> None:
        self._usage = usage

    def feed(self, chunk: bytes) -> None:
        pass

    def finish(self, *, complete: bool) -> Usage:
        return self._usage


class GuardedReader:
    """Wraps a user extractor's reader so that it keeps the never-raise contract."""

    __slots__ = ("_failed", "_inner", "_provider")

    def __init__(self, inner: UsageReader, provider: str = "custom") -> None:
        self._inner = inner
        self._provider = provider
        self._failed = False

    def feed(self, chunk: bytes) -> None:
        if not self._failed:
            try:
                self._inner.feed(chunk)
            except Exception:
                self._failed = True

    def finish(self, *, complete: bool) -> Usage:
        if not self._failed:
            try:
                usage = self._inner.finish(complete=complete)
            except Exception:
                usage = None
            if isinstance(usage, Usage):
                return usage
        return Usage.unknown(self._provider, "custom usage reader failed")


class ReaderPlan(Protocol):
    """How every response of one kind is read: worked out once per kind (endpoint, status,
    content-type, content-coding), then a fresh reader for each response of that kind."""

    def reader(self, info: ResponseFacts) -> UsageReader | None: ...


class ShapePlan:
    """Responses framed and read with one `UsageShape`: a new `FramedReader` for each."""

    __slots__ = ("_coding", "_estimate", "_factory", "_http_error", "_provider", "_shape")

    def __init__(
        self, shape: UsageShape, provider: str, factory: FramerFactory, info: ResponseFacts
    ) -> None:
        self._shape = shape
        self._provider = provider
        self._factory = factory
        self._coding = info.content_encoding
        self._estimate = info.estimate
        self._http_error = not info.ok

    def reader(self, info: ResponseFacts) -> UsageReader:
        decoder = None
        if self._coding:  # decoded anew for each response, with what is installed now
            try:
                decoder = make_decoder(self._coding)
            except UnsupportedEncoding as exc:
                if self._http_error:
                    return FixedReader(Usage.nothing(self._provider))
                return FixedReader(Usage.unknown(self._provider, str(exc)))
        factory = self._factory
        acc = Accumulator(
            self._shape,
            self._provider,
            estimate=self._estimate,
            http_error=self._http_error,
            streaming=factory is not JsonBodyFramer,
        )
        framer: Framer = factory(acc)
        if decoder is not None:
            framer = DecodingFramer(decoder, framer, acc)
        return FramedReader(framer, acc)


class FixedPlan:
    """Responses whose usage is known before their body (an endpoint that counts nothing, a
    content-coding that cannot be undone)."""

    __slots__ = ("_usage",)

    def __init__(self, usage: Usage) -> None:
        self._usage = usage

    def reader(self, info: ResponseFacts) -> UsageReader:
        return FixedReader(self._usage)


class _NoReader:
    """Responses that are not LLM calls worth counting."""

    __slots__ = ()

    def reader(self, info: ResponseFacts) -> None:
        return None


NO_READER: ReaderPlan = _NoReader()


def shape_plan(
    info: ResponseFacts, shape: UsageShape, provider: str, *, sniff: bool = True
) -> ReaderPlan:
    """The plan of `shape_reader`: how responses like `info` whose usage has `shape` are read."""
    factory = _framer_for(info.content_type)
    if factory is None:
        if not sniff:
            return NO_READER
        factory = SniffFramer
    return ShapePlan(shape, provider, factory, info)


def shape_reader(
    info: ResponseFacts, shape: UsageShape, provider: str, *, sniff: bool = True
) -> UsageReader | None:
    """The reader for a response whose usage has `shape`.

    None when the content-type cannot carry usage and `sniff` is off (an unknown endpoint
    returning an image, HTML, audio...): such a response is not an LLM call worth counting.
    """
    return shape_plan(info, shape, provider, sniff=sniff).reader(info)


def endpoint_plan(
    info: ResponseFacts,
    shape: UsageShape | None,
    provider: str,
    *,
    sniff: bool = True,
) -> ReaderPlan:
    """The plan of `endpoint_reader`."""
    if shape is None or info.method != "POST":
        return FixedPlan(Usage.nothing(provider))
    plan = shape_plan(info, shape, provider, sniff=sniff)
    if plan is NO_READER and not info.ok:
        return FixedPlan(Usage.nothing(provider))
    return plan


def endpoint_reader(
    info: ResponseFacts,
    shape: UsageShape | None,
    provider: str,
    *,
    sniff: bool = True,
) -> UsageReader | None:
    """`shape_reader` plus the rules shared by every endpoint: only a successful POST consumes
    tokens (GET and friends retrieve earlier results), `shape=None` marks an endpoint that counts
    nothing by design (count-tokens), and an error response counts nothing unless its body
    reports usage."""
    return endpoint_plan(info, shape, provider, sniff=sniff).reader(info)
