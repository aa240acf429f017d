"""Incremental server-sent events framing (the WHATWG event-stream format).

`data:` lines of one event are joined with LF, the space after the colon is optional, lines
starting with `:` are comments (OpenRouter's keep-alives), `id:` and `retry:` are ignored, and an
empty line dispatches the event. Each event is bounded; a bigger one is dropped with a problem.

The hot path: runs of complete events that mention nothing of interest (no usage key with a
value, no end or error marker) are skipped whole, without splitting them into lines.
"""

from __future__ import annotations

from .lines import MAX_RECORD, RecordFramer


class SseFramer(RecordFramer):
    """Hands each complete SSE event (name, data) to the accumulator."""

    __slots__ = ()

    SEPARATOR = b"\n\n"

    def _records(self, region: bytes) -> None:
        for block in region.split(b"\n\n"):
            if len(block) > MAX_RECORD:
                self._overflow()
            else:
                self._event(block)

    def _event(self, block: bytes) -> None:
        name = b""
        data: list[bytes] = []
        for line in block.split(b"\n"):
            if not line or line[:1] == b":":
                continue  # a leading empty line dispatches nothing; a colon starts a comment
            field, _, value = line.partition(b":")
            if value[:1] == b" ":
                value = value[1:]
            if field == b"data":
                data.append(value)
            elif field == b"event":
                name = value
        if data:
            self._sink.event(name or b"message", data[0] if len(data) == 1 else b"\n".join(data))

    def _overflow(self) -> None:
        self._sink.note("SSE event over 1 MiB dropped")
