"""The state of one response's usage while its payloads go by, and the final `Usage`.

Framers (JSON body, SSE, NDJSON, eventstream) cut the bytes into payloads and hand them here;
everything provider-specific comes from the `UsageShape` table.
"""

from __future__ import annotations

from .estimate import tokens_for
from .model import MAX_COUNT, Usage, UsageShape, as_count
from .scan import ERROR, ErrorFind, probed_find, scanner_for

CLOSED_EARLY = "stream closed before usage"
NO_USAGE_BODY = "no usage in response body"
ERRORED = "error reported in stream"


class Accumulator:
    """Collects counts per field, last value wins, plus how the stream ended."""

    __slots__ = (
        "_pending",
        "_probing",
        "_scanner",
        "_shape",
        "_text",
        "counts",
        "cut",
        "end_seen",
        "errored",
        "errors",
        "http_error",
        "invalid",
        "problem",
        "provider",
        "streaming",
        "text_bytes",
    )

    def __init__(
        self,
        shape: UsageShape,
        provider: str,
        *,
        estimate: bool = False,
        http_error: bool = False,
        streaming: bool = True,
    ) -> None:
        # Made for every response: what follows from the shape alone is the scanner's, made
        # once per shape (`scanner_for`), not copied here.
        self._shape = shape
        self._scanner = scanner = scanner_for(shape)
        self.provider = provider
        # Generated text is counted only for an estimate, and only where the shape says
        # where it is.
        self._text = scanner.text if estimate else None
        self.http_error = http_error
        self.streaming = streaming
        self.counts: dict[str, float] = {}
        self.text_bytes = 0  # of generated text seen, for an estimate
        self.end_seen = False  # a provider's end marker arrived: what we have is final
        self.errored = False  # the stream reported an error in-band
        self.cut = False  # we stopped reading (decode failure, size bound)
        self.invalid = False  # a usage field held something that is not a count
        self.problem: str | None = None
        self._pending = b""  # the latest usage payload of a whole-objects shape, not yet read
        #: The search for ``ERROR`` that a stream's framer shares with its failure-loop watch
        #: (see `ErrorFind`; None: the framer searches on its own).
        self.errors: ErrorFind | None = None
        #: Per marker, which of its probes a stream's searches use (made by the first one).
        self._probing: list[int] | None = None

    def note(self, problem: str) -> None:
        """Remember the first problem; later ones are usually consequences of it."""
        if self.problem is None:
            self.problem = problem

    def stop(self, problem: str) -> None:
        self.cut = True
        self.note(problem)

    def first_of_interest(self, region: bytes, error: int | None = None) -> int:
        """Where the first thing in a run of stream records that may matter starts (-1: none).

        The hot-path test. Most stream events carry text only; a few C-level searches over a
        run of them let the framer skip them without looking at a single line, and read the
        rest from the record this points into. A hit where nothing matters costs only time
        (that record is read and found empty), so the searches may be loose.

        Every run of records passes here exactly once, so this is also where the generated text
        is counted for an estimate.
        """
        if self._text is not None:
            self.text_bytes += self._text.count(region)
        first = region.find(ERROR) if error is None else error
        probing = self._probing
        if probing is None:
            probing = self._probing = [0] * len(self._scanner.markers)
        for index, (marker, probes) in enumerate(self._scanner.markers):
            # A marker with a probe (a byte the stream rarely carries) is found through it;
            # when a stream carries it often, its next probe is tried, then the marker itself.
            # Either way the answer is `find`'s.
            tried = probing[index]
            if tried < len(probes):
                probe, offset = probes[tried]
                at, busy = probed_find(region, marker, probe, offset)
                if busy:
                    probing[index] = tried + 1
            else:
                at = region.find(marker)  # find, not `in`: bytes.__contains__ tries int first
            if at >= 0 and (first < 0 or at < first):
                first = at
        valued = self._scanner.valued_at(region)
        if valued >= 0 and (first < 0 or valued < first):
            first = valued
        return first

    def event(self, name: bytes, data: bytes) -> None:
        """One SSE event or eventstream message."""
        if name == b"error":
            self.errored = True
        elif name in self._shape.end_events:
            self.end_seen = True
        self.payload(data)

    def payload(self, data: bytes) -> None:
        """One JSON document from a stream (an SSE data field, an NDJSON line, ...)."""
        if data == b"[DONE]":
            self.end_seen = True
            return
        if data.lstrip().startswith(b'{"error"'):
            self.errored = True
        for key in self._shape.end_keys:
            if data.find(key) >= 0:
                self.end_seen = True
        if not self._scanner.has_value(data):
            return
        if self._shape.whole_objects:
            self._pending = data  # superseded by any later one: parsed only if it stays last
        else:
            self._take_payload(data)

    def _take_payload(self, data: bytes) -> None:
        if not self.take_last(data) and not self.invalid:
            self.note("malformed JSON in stream")

    def take_last(self, data: bytes) -> bool:
        """Take the last usage object in raw JSON `data` that holds a count."""
        return any(self.take(node) for node in self._scanner.objects(data))

    def observe(self, parsed: object) -> None:
        """A parsed document, or a JSON array of them (Gemini's stream without alt=sse)."""
        for item in parsed if isinstance(parsed, list) else (parsed,):
            if isinstance(item, dict):
                self._observe(item)

    def _observe(self, doc: dict[str, object]) -> None:
        for path in self._shape.containers:
            node: object = doc
            for key in path:
                node = node.get(key) if isinstance(node, dict) else None
            if isinstance(node, dict) and self.take(node):
                break

    def body_text(self, body: bytes | bytearray) -> None:
        """A whole JSON body (not a stream): count its generated text for an estimate."""
        if self._text is not None:
            self.text_bytes += self._text.count(body)

    def take(self, node: dict[str, object]) -> bool:
        """Read the count fields of one usage object; True if any was a valid count."""
        found = False
        for field in self._scanner.fields:
            value = node.get(field)
            if value is None:
                continue  # absent or null (Anthropic deltas send null cache fields)
            # A plain int in range is what providers send: counted without a call; anything
            # else is judged by `as_count`.
            count = (
                float(value) if type(value) is int and 0 <= value <= MAX_COUNT else as_count(value)
            )
            if count is None:
                self.invalid = True
            else:
                self.counts[field] = count
                found = True
        return found

    def result(self, *, complete: bool) -> Usage:
        if self._pending:
            self._take_payload(self._pending)
            self._pending = b""
        partial = self.errored or self.cut or not (complete or self.end_seen)
        if self.counts:
            return self._combine(partial)
        if self.http_error:
            return Usage.nothing(self.provider)  # an error status without usage spent nothing
        if self.invalid:
            self.note("invalid usage numbers ignored")
        if self.errored:
            self.note(ERRORED)  # the error may have come after text was generated: unknown
        if partial:
            self.note(CLOSED_EARLY)
        self.note(self._shape.missing_hint if self.streaming else NO_USAGE_BODY)
        problem = self.problem or ""
        if self.text_bytes:
            tokens = tokens_for(self.text_bytes)
            return Usage(
                total=tokens,
                output=tokens,
                provider=self.provider,
                partial=partial,
                estimated=True,
                problem=problem,
            )
        return Usage.unknown(self.provider, problem, partial=partial)

    def _sum(self, fields: tuple[str, ...]) -> float | None:
        # A plain loop: this runs for every response, and building a list to sum costs more
        # than the few additions. Added from 0.0 on, in order, as `sum` does.
        counts = self.counts
        found: float | None = None
        for field in fields:
            if field in counts:
                found = (0.0 if found is None else found) + counts[field]
        return found

    def _combine(self, partial: bool) -> Usage:
        counts, shape = self.counts, self._shape
        total = None
        for field in shape.total:
            if field in counts:
                total = counts[field]
                break
        input_, output = self._sum(shape.input), self._sum(shape.output)
        problem = None
        if total is None:
            if shape.input and input_ is None:
                partial, problem = True, "input tokens not reported"
            elif shape.output and output is None:
                partial, problem = True, "output tokens not reported"
            total = (input_ or 0.0) + (output or 0.0)
        if partial and problem is None:
            if self.errored:
                self.note(ERRORED)
            problem = self.problem or "stream closed before final usage"
        return Usage(total, input_, output, self.provider, partial=partial, problem=problem)
