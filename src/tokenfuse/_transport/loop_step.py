"""The failure-loop step of an outbound call: check before sending, note after the response.

Before a request leaves (``prepare``/``conclude``), its conversation is read for a tool-call
loop (``_core.tool_history``: the model asking again for a call that keeps failing; refused
at once, no store asked), then the breaker checks the call's fingerprint (``CheckLoops``: a
tripped call is refused before a byte leaves). A refusal goes through the transport's
``Gatekeeper``, so shadow mode and the anthropic SDK are served as for every refusal.

**Where the send is counted.** With ``on_repeat="event"`` (the default) the check only asks
"is this call tripped?" (``CheckLoops.local``): it counts nothing, so ``RedisStore`` answers it
from its open-key view with no round trip, and the send is counted *after* the call, by its
note (``NoteLoop.send``), which may report a ``repeat_loop`` event (the call went on anyway,
as "event" says). With ``on_repeat="refuse"`` the call that makes a repeat loop must be
refused before it leaves, so the check counts the send before it, as a round trip of its own
(with the gate and the run budgets' reservations).

After the response, the call is a *failure* when its status is 400 or more (429 excepted:
that is the provider's back-pressure, which the SDKs retry and the velocity fuse watches), or
when its body is an error object, or its stream carries an error event. Its note (a
``LoopNote``: the send, with "event"; the failure, which may trip the call; a success, which
ends earlier failures) is made once the body is seen whole: at once for a body already read,
else when its stream ends or is closed. It goes with the call's record
(``take``: the transport's settle sends both in one pipeline, or hands both to the background
recorder), or alone when the call records nothing (then to the recorder with
``record="background"``, else its own round trip). With "refuse", a success is noted only when
it ends earlier failures (most calls cost no note at all).

Not checked: requests without a body in memory (a streamed upload, a GET). An SDK's own
retries of a call (``x-stainless-retry-count`` above 0) are checked (a tripped call's retries
are refused too) and count as sends, but their failures are not counted again: one call that
the SDK tries three times against a failing server is one failure, not a loop.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from functools import partial
from typing import Any

from .._core.loops import LoopVerdict, parsed_body
from .._core.tool_history import failing_tail, tool_loop
from .._events import logger
from .._fuse import Fuse
from .._identity import Identity
from .._loops import CallName, FailureLoopPolicy, LoopBreaker, LoopCheck, LoopNote, plain
from .._usage.scan import ERROR, ErrorFind
from .compat import Endpoint, Flavor, header_entries
from .recorder import Recorder
from .refusal import Gatekeeper
from .stream import AsyncMeteredStream, MeteredStream, _of_library
from .usage_option import sent_body

__all__ = ["LoopStep", "LoopWatch", "failure_of"]

#: Statuses that are no failure of the call (``after``).
_NOT_FAILURES = frozenset({429})
#: How much of a body is kept to read an error object from.
_HEAD = 64 * 1024
#: Marks of an error event in a server-sent event stream (OpenAI, Anthropic, others).
_STREAM_ERRORS = (
    b"event: error",
    b"event:error",
    b'"type":"error"',
    b'"type": "error"',
    b'"type":"response.failed"',
    b'"type": "response.failed"',
    b'data: {"error"',
    b'data:{"error"',
)
#: A mark found in a batch of chunks may have begun in the last bytes of the previous one.
_CARRY = max(len(mark) for mark in _STREAM_ERRORS) - 1
#: An event stream's chunks are searched for the marks a batch at a time, once this many bytes
#: have come: a stream has thousands of chunks of a few dozen bytes, and a search costs some
#: 1.4k instructions however short the chunk, an append a tenth of that. (The transport's
#: metered stream shows the watch bigger batches of its own; ``LoopStream`` shows it chunks.)
_BATCH = 8 * 1024


def failure_of(status: int, body: bytes, event_stream: bool) -> tuple[bool, str]:
    """Whether a response is a failure, and its error type ('' when unknown)."""
    if status in _NOT_FAILURES:
        return False, ""
    if event_stream:
        failed = status >= 400 or any(body.find(mark) >= 0 for mark in _STREAM_ERRORS)
        return failed, "stream_error" if failed and status < 400 else ""
    error = _error_object(body) if status >= 400 or body.find(b'"error"') >= 0 else None
    if status >= 400:
        return True, _error_type(error)
    if error is not None:
        return True, _error_type(error) or "error_object"
    return False, ""


def _error_object(body: bytes) -> Any:
    """The ``error`` of a JSON error body (OpenAI's, Anthropic's ``"type": "error"``)."""
    if not body or body[:1] not in (b"{", b" ", b"\n"):
        return None
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(parsed, dict):
        return None
    error = parsed.get("error")
    return error if error else None


def _error_type(error: Any) -> str:
    if isinstance(error, dict):
        for field in ("type", "code", "status"):
            value = error.get(field)
            if isinstance(value, str) and value:
                return value
            if isinstance(value, int) and not isinstance(value, bool):
                return str(value)
    return ""


# The two headers below are read from the library's own entries (``header_entries``): an
# httpx ``headers.get`` lower-cases the name, decodes every value matching it with the
# headers' encoding (worked out by decoding them all) and joins them, some 1.3 µs a call; a
# scan of the raw entries reads the same answer in a third of that.


def _event_stream(response: Any) -> bool:
    """Whether the response's content type is an event stream: ``"text/event-stream" in
    headers.get("content-type", "")``. The mark is ASCII, with neither comma nor space, so
    it is in the joined, decoded values exactly when it is in one raw value."""
    for _, name, value in header_entries(response.headers):
        if name == b"content-type" and value.find(b"text/event-stream") >= 0:
            return True
    return False


def _is_retry(request: Any) -> bool:
    """Whether the request is an SDK's retry: ``headers.get("x-stainless-retry-count", "0")``
    is neither "" nor "0". The SDKs send this header with every call (0 on the first try);
    sent twice, ``get`` joins the values (``"0, 0"``): a retry, as here."""
    count = None
    for _, name, value in header_entries(request.headers):
        if name == b"x-stainless-retry-count":
            if count is not None:
                return True
            count = value
    return count is not None and count not in (b"", b"0")


class LoopWatch:
    """One call under watch: who, which call, and what its note must say: whether a success
    must be noted, whether it counts the send (``send``), whether its outcome counts
    (``judged``: not for an SDK's retry); ``response``, ``event_stream`` and ``whole`` once it
    is seen. ``key``: the identity's store key, as its check named it (None: the note
    works it out)."""

    __slots__ = (
        "_batch",
        "_batched",
        "_carry",
        "_errors",
        "_kept",
        "_marked",
        "_parts",
        "call",
        "done",
        "event_stream",
        "identity",
        "judged",
        "key",
        "needs_success",
        "response",
        "send",
        "whole",
    )

    def __init__(self, identity: Identity, call: CallName, needs_success: bool) -> None:
        self.identity = identity
        self.call = call
        self.needs_success = needs_success
        self.send = False
        self.judged = True
        self.key: str | None = None
        self.response: Any = None
        self.event_stream = False
        self.whole = False  # the body was read before the response came back, and fed
        self._parts: list[bytes] = []
        self._kept = 0
        self._batch: list[bytes] = []
        self._batched = 0
        self._carry = b""
        self._marked = False
        self._errors: ErrorFind | None = None  # the usage reader's search, shared (``share``)
        self.done = False

    def answered(self, response: Any) -> None:
        """The response came: kept, with whether it is an event stream, read from its headers
        once (``_event_stream``)."""
        self.response = response
        self.event_stream = _event_stream(response)

    @property
    def head(self) -> bytes:
        """The start of the body (at most ``_HEAD`` bytes), for an error object."""
        return b"".join(self._parts)

    @property
    def marked(self) -> bool:
        """Whether the body fed so far holds an error mark (``_STREAM_ERRORS``)."""
        if self._batch:
            self._search()
        return self._marked

    def feeder(self, event_stream: bool) -> Callable[[bytes], None]:
        """What a streamed body's chunks are shown to: an event stream's errors are its marks
        (``find``), any other body's its head (``keep``): each piece pays for one of them."""
        return self.find if event_stream else self.keep

    def feed(self, chunk: bytes) -> None:
        """Look at a body read at once (or a chunk of it): keep its start, find its marks."""
        self.keep(chunk)
        self.find(chunk)

    def see(self, body: bytes) -> None:
        """Look at a body read before the response came back, whole: its head is kept;
        its marks are found only in an event stream (the only body ``_outcome`` reads them
        of), so a JSON call's body costs no search."""
        self.keep(body)
        if self.event_stream:
            self.find(body)
        self.whole = True

    def keep(self, chunk: bytes) -> None:
        """Keep the start of the body: a list of slices, joined once, at the end."""
        if self._kept < _HEAD:
            part = chunk[: _HEAD - self._kept]
            self._parts.append(part)
            self._kept += len(part)

    def find(self, chunk: bytes) -> None:
        """Look for error marks, a batch of chunks (``_BATCH`` bytes) at a time: a chunk is
        only put aside (``marked`` searches what is left); a piece as big as a batch (the
        metered stream's) is searched as it is."""
        if len(chunk) >= _BATCH:
            if self._batch:  # the chunks before it first: the seam must be theirs
                self._search()
            self._search_piece(chunk)
            return
        self._batch.append(chunk)
        self._batched += len(chunk)
        if self._batched >= _BATCH:
            self._search()

    def share(self, errors: ErrorFind) -> None:
        """Find ``ERROR`` in a piece through ``errors``: the usage reader's search of the same
        batches (the metered stream's, ``attach``), made once for both. Only for an event
        stream: any other body's head is kept, not searched (``feeder``), and a share of no
        use would cost a JSON call a few Python calls."""
        self._errors = errors

    def _search(self) -> None:
        piece = b"".join(self._batch)
        self._batch.clear()
        self._batched = 0
        self._search_piece(piece)

    def _search_piece(self, piece: bytes) -> None:
        # A mark that ends in this piece lies wholly in it, or began in the last _CARRY bytes
        # before it and so ends in its first _CARRY: the seam holds it. Searching the piece
        # where it lies and the seam apart spares a copy of the piece (32 KiB from the
        # metered stream) per batch.
        seam = self._carry + piece[:_CARRY]
        self._carry = piece[-_CARRY:] if len(piece) >= _CARRY else seam[-_CARRY:]
        if not self._marked:
            errors = self._errors
            error = piece.find(ERROR) if errors is None else errors.at(piece)
            self._marked = _holds_mark(seam) or _holds_mark(piece, error)


def _holds_mark(window: bytes, error: int | None = None) -> bool:
    # A window without "error" nor "response.failed" (one is in every mark) holds none; the
    # longer a word, the further each step of the search skips. ``error``: where "error" is in
    # the window, if known (a search shared with the usage reader). Bytes are searched with
    # ``find``, never ``in``: CPython first tries an ``in`` operand as an integer, and formats
    # the TypeError it then drops.
    if error is None:
        error = window.find(ERROR)
    if error < 0 and window.find(b"response.failed") < 0:
        return False
    return any(window.find(mark) >= 0 for mark in _STREAM_ERRORS)


class LoopStep:
    """The transport's failure-loop step (None policy: a step that does nothing).

    ``recorder``: the transport's background recorder, which takes the notes of calls that
    record nothing (None: ``record="inline"``, such a note is a round trip of its own)."""

    __slots__ = ("_gate", "_recorder", "breaker", "count_after", "policy")

    def __init__(
        self,
        fuse: Fuse,
        policy: FailureLoopPolicy | None,
        gate: Gatekeeper,
        recorder: Recorder | None = None,
    ) -> None:
        self.policy = policy
        self.breaker = LoopBreaker(fuse, policy) if policy is not None else None
        self._gate = gate
        self._recorder = recorder
        # "event": the check asks only "is it tripped?", and the note counts the send.
        self.count_after = policy is not None and policy.on_repeat == "event"

    # -- before sending ---------------------------------------------------------------------

    def _name(
        self, breaker: LoopBreaker, request: Any, where: Endpoint | None
    ) -> tuple[CallName, bytes, Any] | None:
        """The call's name, its body and the body parsed (None: a JSON value, else None).
        ``where``: the request's endpoint, as the transport read it (None: read here)."""
        body = sent_body(request)
        if not body:
            return None
        if where is not None:
            host, path = where  # the host lower-cased: the fingerprint lower-cases it anyway
        else:
            url = request.url
            try:
                host = url.raw_host.decode("ascii", "replace")
                path = url.raw_path.decode("ascii", "replace").partition("?")[0]
            except Exception:
                return None
        parsed = parsed_body(body)
        return breaker.name(request.method, host, path, body, parsed), body, parsed[1]

    def _tool_loop(
        self, identity: Identity, call: CallName, body: bytes, parsed: Any, request: Any
    ) -> None:
        policy, breaker = self.policy, self.breaker
        if policy is None or breaker is None:
            return
        try:
            tail = failing_tail(parsed, body)  # the end: all that makes a loop
            if not tail:  # no failing call at the end (most requests): no loop
                return
            loop = tool_loop(tail, policy.tool_failures, policy.tool_alternations)
        except Exception as exc:  # a body of a shape no one foresaw must not break the call
            logger.debug("tokenfuse: reading the tool calls failed: %r", exc)
            return
        if loop is not None:
            decision = breaker.tool_refusal(identity, call, loop.tool, loop.count, "tool error")
            self._gate.check(decision, request)

    def prepare(
        self, identity: Identity, request: Any, where: Endpoint | None = None
    ) -> LoopCheck | None:
        """The call's check, to run in the transport's one round trip before sending (with
        the gate and the run budgets' reservations); refuses a tool-call loop at once (no
        store needed). None: nothing to check. ``where``: the request's endpoint, when the
        transport has read it (``endpoint_of``)."""
        breaker = self.breaker
        if breaker is None:  # the breaker is off: the body is not even read
            return None
        named = self._name(breaker, request, where)
        if named is None:
            return None
        call, body, parsed = named
        self._tool_loop(identity, call, body, parsed, request)
        check = breaker.prepare(identity, call, local=self.count_after)
        check.body = parsed
        return check

    def conclude(
        self, identity: Identity, check: LoopCheck | None, found: Any, request: Any
    ) -> LoopWatch | None:
        """Refuse a looping call on its check's verdict (``found``; None when the store was not
        asked or failed: the gate's decision counted that, and the call goes unchecked), or
        the watch of the call."""
        breaker = self.breaker
        if check is None or breaker is None:
            return None
        if found is not None:
            if plain(found):  # most calls: nothing to refuse nor report (the metrics count it)
                breaker.passed(identity, check, found)
            else:
                self._gate.check(breaker.concluded(identity, check, found), request)
        # The call was let through: its watch. An SDK's retry is noted only to count its send
        # (``send``: the check did not), never its outcome; no watch when there is nothing to.
        send = self.count_after
        retry = _is_retry(request)
        if retry and not send:
            return None
        verdict: LoopVerdict | None = found
        watch = LoopWatch(identity, check.call, verdict is not None and verdict.failures > 0)
        watch.send = send
        watch.judged = not retry
        watch.key = check.op.key
        return watch

    # -- after the response -------------------------------------------------------------------

    def after(self, watch: LoopWatch | None, response: Any, flavor: Flavor) -> None:
        """Watch the response: a body already read is seen at once (its note is ``take``n
        by the settle that follows); a stream as it passes, fed by the transport's metered
        stream (``attach``: one generator for both), whose settle at the end or on close
        takes the note; any other stream is wrapped, and noted when it ends or closes."""
        if watch is None:
            return
        watch.answered(response)
        body = getattr(response, "_content", None)  # as meter._body_if_read
        if body is not None:
            watch.see(body)
            return
        feed = watch.feeder(watch.event_stream)
        share = watch.share if watch.event_stream else None  # see LoopWatch.share
        stream = response.stream
        done = partial(self._note, watch)
        if isinstance(stream, MeteredStream) and stream.attach(feed, done, share):
            return  # the meter's stream shows the watch its batches: one generator for both
        response.stream = _of_library(LoopStream, flavor.sync_stream_base, flavor)(
            stream, feed, done
        )

    async def aafter(self, watch: LoopWatch | None, response: Any, flavor: Flavor) -> None:
        if watch is None:
            return
        watch.answered(response)
        body = getattr(response, "_content", None)
        if body is not None:
            watch.see(body)
            return
        feed = watch.feeder(watch.event_stream)
        share = watch.share if watch.event_stream else None
        stream = response.stream
        done = partial(self._anote, watch)
        if isinstance(stream, AsyncMeteredStream) and stream.attach(feed, done, share):
            return
        response.stream = _of_library(AsyncLoopStream, flavor.async_stream_base, flavor)(
            stream, feed, done
        )

    def take(self, watch: LoopWatch | None, ended: bool) -> LoopNote | None:
        """The call's note, for the transport's settle to send with the call's record, once
        the whole body was seen: read before it came back, or ``ended`` (the settle comes at
        the end of the stream, once the watch has seen every chunk: the metered stream feeds
        it before settling). None: nothing to note, or not yet (a stream the settle does not
        wait for is noted when it ends)."""
        if watch is None or not (ended or watch.whole) or watch.response is None:
            return None
        return self._later(watch)

    def raised(self, watch: LoopWatch | None) -> None:
        """The send raised (no response: a connection error, a timeout): with "event" its
        send is counted all the same, as a counting check would have, and no outcome (only
        a response is a failure of the call)."""
        note = self._unanswered(watch)
        if note is not None:
            self._send_alone(note)

    async def araised(self, watch: LoopWatch | None) -> None:
        note = self._unanswered(watch)
        if note is not None:
            await self._asend_alone(note)

    def _unanswered(self, watch: LoopWatch | None) -> LoopNote | None:
        if watch is None or watch.done or not watch.send or self.breaker is None:
            return None
        watch.done = True
        return self.breaker.later(watch.identity, watch.call, None, send=True, key=watch.key)

    def _later(self, watch: LoopWatch) -> LoopNote | None:
        if watch.done:  # noted already: the settle took the note, and the stream then ended
            return None
        watch.done = True
        outcome = self._outcome(watch, watch.response)
        if outcome is None or self.breaker is None:
            return None
        failed, status, error = outcome
        return self.breaker.later(
            watch.identity, watch.call, failed, status, error, watch.send, watch.key
        )

    def _outcome(self, watch: LoopWatch, response: Any) -> tuple[bool | None, int, str] | None:
        """(failed, status, error type; failed None: the outcome is not counted), or None when
        there is nothing to note."""
        if not watch.judged:
            return (None, 0, "") if watch.send else None
        status = int(response.status_code)
        stream = watch.event_stream
        failed, error = failure_of(status, watch.head, stream)
        if stream and watch.marked and status not in _NOT_FAILURES:
            failed, error = True, error or "stream_error"
        if not (failed or watch.needs_success or watch.send):
            return None
        return failed, status if status >= 400 else 0, error

    def _note(self, watch: LoopWatch) -> None:
        """The stream ended or closed, and the settle did not take the note: send it alone
        (to the background recorder if there is one)."""
        note = self._later(watch)
        if note is not None:
            self._send_alone(note)

    async def _anote(self, watch: LoopWatch) -> None:
        note = self._later(watch)
        if note is not None:
            await self._asend_alone(note)

    def _send_alone(self, note: LoopNote) -> None:
        """A note with no record to ride with: to the background recorder, else a round trip."""
        if self._recorder is not None:
            self._recorder.submit(None, None, note)
            return
        try:
            note.send()
        except Exception as exc:  # only a fail_closed fuse raises; the response is the caller's
            logger.debug("tokenfuse: noting a call for the loop breaker failed: %r", exc)

    async def _asend_alone(self, note: LoopNote) -> None:
        if self._recorder is not None:
            self._recorder.submit(None, None, note)  # never waits (inline only when full)
            return
        try:
            await note.asend()
        except Exception as exc:
            logger.debug("tokenfuse: noting a call for the loop breaker failed: %r", exc)


class LoopStream:
    """Sync mixin: pass the body on, show it to the watch, note the call at the end. Only for
    a body the meter does not read (no usage reader for it): else the meter's stream shows
    the watch its chunks (``MeteredStream.attach``)."""

    def __init__(self, inner: Any, feed: Callable[[bytes], None], done: Callable[[], None]):
        self._inner = inner
        self._feed = feed
        self._done = done

    def __iter__(self) -> Iterator[bytes]:
        feed = self._feed
        for chunk in self._inner:
            feed(chunk)
            yield chunk
        self._done()

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            self._done()


class AsyncLoopStream:
    """Async mixin: the same as ``LoopStream``."""

    def __init__(
        self, inner: Any, feed: Callable[[bytes], None], done: Callable[[], Awaitable[None]]
    ) -> None:
        self._inner = inner
        self._feed = feed
        self._done = done

    async def __aiter__(self) -> AsyncIterator[bytes]:
        feed = self._feed
        async for chunk in self._inner:
            feed(chunk)
            yield chunk
        await self._done()

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            await self._done()
