"""Whole JSON bodies: parsed when they fit a bound, tail-scanned when they do not.

Bodies up to `MAX_BODY` are buffered and parsed with json.loads. A bigger body (embeddings with
base64 vectors run to many MB) keeps only a bounded tail window: providers put usage after the
content (OpenAI, Anthropic, Gemini, Bedrock, Ollama all serialise it last), so the last usage
object is in the tail, where `scan.UsageScanner` finds it (the last usage key followed by a
colon, its value decoded alone with `raw_decode`). The same scan salvages the last complete
running total from a truncated body, such as Gemini's JSON-array stream
(`:streamGenerateContent` without `alt=sse`) closed early.
"""

from __future__ import annotations

from collections.abc import Callable
from json import JSONDecoder, loads

from .accumulator import Accumulator

MAX_BODY = 2 * 1024 * 1024
TAIL = 64 * 1024

# The C scanner `loads` ends in (one value at an offset); typeshed does not declare it.
_scan: Callable[[str, int], tuple[object, int]] = JSONDecoder().scan_once  # type: ignore[attr-defined]
_BLANK = " \t\n\r"  # JSON's whitespace


def parse(body: bytes | bytearray) -> object:
    """``json.loads(body)``, with less Python around the C scanner for a body that starts with
    ``{`` (every provider's): UTF-8 then, as ``loads`` would detect (a NUL byte after it means
    UTF-16 or UTF-32: ``loads`` itself reads those). Raises ``ValueError`` where ``loads``
    does."""
    if body[:1] != b"{" or body[1:2] == b"\0":
        return loads(body)
    text = body.decode("utf-8", "surrogatepass")
    try:
        value, end = _scan(text, 0)
    except StopIteration:  # no value where one starts: what `loads` reports as a ValueError
        raise ValueError("expecting a value") from None
    if end != len(text) and text[end:].strip(_BLANK):
        raise ValueError("extra data after the JSON value")
    return value


class JsonBodyFramer:
    """Buffers one JSON body (bounded) and reads its usage at the end."""

    __slots__ = ("_buf", "_overflowed", "_sink")

    def __init__(self, sink: Accumulator) -> None:
        self._sink = sink
        self._buf = bytearray()
        self._overflowed = False

    def feed(self, chunk: bytes) -> None:
        self._buf += chunk
        if len(self._buf) > MAX_BODY:
            self._overflowed = True
            del self._buf[:-TAIL]

    def close(self, complete: bool) -> None:
        sink = self._sink
        if not self._buf:
            sink.note("empty body")
            return
        if not self._overflowed:
            try:
                parsed = parse(self._buf)
            except (ValueError, RecursionError):
                if complete:
                    sink.note("malformed JSON")
                    return
            else:
                sink.observe(parsed)
                sink.end_seen = True  # the whole body is here, however the stream was closed
                if not sink.counts:
                    sink.body_text(self._buf)
                return
        if not sink.take_last(bytes(self._buf)):
            sink.note("no usage found in the tail of a large or truncated body")
            sink.body_text(self._buf)
