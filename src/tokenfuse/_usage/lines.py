"""Incremental record framing shared by SSE and NDJSON, and the NDJSON framer.

Lines end with CR, LF or CRLF, and only those: `str.splitlines` would also split on U+2028,
U+0085 and friends, which may legally sit inside JSON strings. A CRLF may be cut between two
chunks (CR at the end of one, LF at the start of the next); that is one line ending, not two.
Line endings are normalised to LF, then the stream is cut at a separator: LF for NDJSON lines,
an empty line (LF LF) for SSE events.
"""

from __future__ import annotations

from .accumulator import Accumulator
from .scan import ERROR

MAX_RECORD = 1024 * 1024  # a longer event or line is dropped: no usage payload comes near this


class RecordFramer:
    """Hands each run of complete records to `_records` as chunks arrive; bounded memory.

    Records are not split one by one here: a run is read from the first record that may
    matter (`Accumulator.first_of_interest`), and one in which nothing does is skipped whole.
    On the hot path a chunk costs a few C-level bytes operations and no copy.
    """

    __slots__ = ("_buf", "_dropping", "_first_of_interest", "_sink", "_skip_lf")

    SEPARATOR = b"\n"

    def __init__(self, sink: Accumulator) -> None:
        self._sink = sink
        self._first_of_interest = sink.first_of_interest  # bound once: it runs on every chunk
        self._buf = bytearray()  # the unfinished last record
        self._skip_lf = False  # the previous chunk ended with CR: a leading LF completes a CRLF
        self._dropping = False  # the unfinished record outgrew the bound: discard up to its end

    def _records(self, region: bytes) -> None:
        """Read a run of complete records."""
        raise NotImplementedError

    def _overflow(self) -> None:
        raise NotImplementedError

    def feed(self, chunk: bytes) -> None:
        if self._skip_lf or chunk.find(b"\r") >= 0:  # find is cheaper than `in` on bytes
            chunk = self._normalise(chunk)
        sep = self.SEPARATOR
        if chunk.endswith(sep) and not self._buf and not self._dropping:
            # The hot path: nothing buffered, and the chunk is whole records. (A chunk that is
            # just a separator reads as an empty run: nothing.)
            self._read(chunk, len(chunk) - len(sep), self._error_at(chunk))
            return
        end = chunk.rfind(sep)
        if end > 0 and not self._buf and not self._dropping:
            # Nothing buffered, and the chunk ends one or more records, then starts another.
            # The first error of the chunk is the first of its records, if it ends in them.
            error = self._error_at(chunk)
            self._read(chunk[:end], end, error if error + len(ERROR) <= end else -1)
            self._buf += chunk[end + len(sep) :]
            self._bound()
            return
        buf = self._buf
        width = len(sep) - 1  # bytes of a separator that may straddle the buffer and the chunk
        if end < 0 and not (width and buf and sep in buf[-width:] + chunk[:width]):
            buf += chunk
            self._bound()
            return
        # Each buffered byte is copied here once, when its record completes: linear overall.
        held = len(buf)
        data = bytes(buf) + chunk
        end = data.rfind(sep)
        buf.clear()
        buf += data[end + len(sep) :]
        region = data[:end]
        first_error: int | None = None  # unknown
        if self._dropping:
            self._dropping = False
            first = region.find(sep)  # the end of the dropped record
            region = region[first + len(sep) :] if first >= 0 else b""
        else:
            # An error in the region begins in what was held (found in it and the chunk's
            # first bytes), or lies in the chunk: the chunk's own search tells where.
            first_error = data.find(ERROR, 0, min(held + len(ERROR) - 1, end))
            if first_error < 0:
                at = self._error_at(chunk)
                first_error = held + at if at >= 0 and held + at + len(ERROR) <= end else -1
        if region:
            self._read(region, len(region), first_error)
        self._bound()

    def close(self, complete: bool) -> None:
        # A stream that ended normally may omit the final separator; after an early close the
        # unfinished record is probably cut short, so it is not read (nor called malformed).
        if complete and self._buf and not self._dropping:
            region = bytes(self._buf)
            self._read(region, len(region))
        self._buf.clear()

    def _error_at(self, chunk: bytes) -> int:
        """Where ``ERROR`` first is in ``chunk``: searched through the search shared with the
        failure-loop watch (``Accumulator.errors``), which is shown the same batches."""
        errors = self._sink.errors
        return chunk.find(ERROR) if errors is None else errors.at(chunk)

    def _read(self, data: bytes, end: int, error: int | None = None) -> None:
        """Read the records in ``data[:end]`` from the first one that may matter.

        What follows ``end`` in ``data`` is a separator at most: it is searched along with the
        records (it cannot hide anything from the search), which spares copying a run that is
        skipped. The records before the first match hold nothing to read. ``error``: where
        ``ERROR`` first is in ``data`` (None: unknown).
        """
        first = self._first_of_interest(data, error)
        if first < 0 or first >= end:
            return
        sep = self.SEPARATOR
        cut = data.rfind(sep, 0, first)  # the end of the record before the one matched
        self._records(data[cut + len(sep) if cut >= 0 else 0 : end])

    def _normalise(self, chunk: bytes) -> bytes:
        if self._skip_lf:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        if b"\r" in chunk:
            self._skip_lf = chunk.endswith(b"\r")
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        return chunk

    def _bound(self) -> None:
        buf = self._buf
        if len(buf) > MAX_RECORD:
            del buf[: len(buf) - len(self.SEPARATOR) + 1]  # keep what may start a separator
            if not self._dropping:
                self._dropping = True
                self._overflow()


class NdjsonFramer(RecordFramer):
    """Newline-delimited JSON (Ollama's native streams): every line is one payload."""

    __slots__ = ()

    def _records(self, region: bytes) -> None:
        for line in region.split(b"\n"):
            line = line.strip()
            if len(line) > MAX_RECORD:
                self._overflow()
            elif line:
                self._sink.payload(line)

    def _overflow(self) -> None:
        self._sink.note("NDJSON line over 1 MiB dropped")
