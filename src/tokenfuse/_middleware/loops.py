"""Inbound: the failure-loop breaker in front of tool endpoints.

The middleware sees a tool call directly: who calls, which route, with which arguments, and
what came back. The same caller calling the same route (method, path) with the same
normalised arguments (the query, its parameters sorted, and the JSON body, normalised as the
outbound fingerprint does: ``_core/loops.py``) and getting an error **3 times within 2
minutes** (``FailureLoopPolicy``) is refused for the cooldown: a 429 whose JSON says
``"type": "failure_loop"``, which call (``"call": "POST /tools/refund #3f9a0c12"``) and how
many times (``"count": 3``), in the same shape as every other refusal (``reply.refused``).

**An error** is a response status of 400 or more, except 429 (a rate limit, the app's or
tokenfuse's own, is back-pressure, not a mistake of the caller): a 400/422 for bad arguments,
a 404 for a missing object, a 500 for a tool that crashes are what a stuck agent repeats; an
app that raises counts as a 500.

**Repeats** (the same call again and again, failing or not) are refused with
``on_repeat="refuse"``, and otherwise not reported: a tool endpoint sees the same call from
the same caller all the time (a poll, a retry, a bodiless ``POST``), so inbound only a
failure makes a loop unless told otherwise.

The body is read before the app runs, up to ``BODY_LIMIT`` bytes, and handed on untouched
(``mcp.body``: the same messages, then the rest from the server); a larger body is
fingerprinted by its first ``BODY_LIMIT`` bytes.

**Round trips.** Repeats are not reported inbound, so unless they are refused
(``on_repeat="refuse"``) no send needs counting, and the check asks only "is this call
tripped?" (``CheckLoops.local``). A store that keeps a view of the tripped calls
(``RedisStore``'s open-key view, once synced: ``_stores/open_keys.py``) answers that without
a round trip, so the direct mode sends the admission (``Admit``) alone before the app, as a
plain script call (``Fuse.admit_with`` asks the store first: ``RedisStore.known``), and
lease mode (``lease=True``) sends nothing; while the view is not trusted, the check goes in
one pipeline with the admission (``Fuse.admit_with``; in lease mode, a round trip of its
own). After the app, a note goes to the store only for an error, or for a success that ends
failures this process saw (failures counted by other processes stand until their window
passes). With ``on_repeat="refuse"`` every check is sent and counts a send. A store that
fails fails the pipeline once: counted once, logged, and failed open (or closed) by the fuse,
as every decision is; the call then goes unchecked for loops.

**A refused request is still counted as sent** when sends are counted (``on_repeat=
"refuse"``). The store runs the admission and the check together, before either answer is
known, so a request the bucket or the velocity latch refuses has been counted by the check as
a send of its call (its verdict is then dropped: the admission's refusal is the answer, and no
``check_loops`` decision is counted). That is deliberate: the caller did send it, and a
caller repeating one call into a refusal repeats it all the same. A failure loop is never
made by it: only failures noted after the app trip one.
"""

from __future__ import annotations

import functools
import io
import logging
from collections.abc import Callable, Iterable
from time import perf_counter
from typing import Any
from urllib.parse import parse_qsl, urlencode

from .._core.loops import LoopVerdict
from .._errors import StoreUnavailable
from .._fuse import Decision, Fuse
from .._identity import Identity
from .._loops import CallName, FailureLoopPolicy, LoopBreaker, LoopCheck, plain
from .._observe import WATCHERS
from .._stores.ops import CheckLoops
from .mcp.body import Receive, read_body
from .request import RequestView

__all__ = ["BODY_LIMIT", "InboundLoops", "LoopCall", "has_body", "is_failure", "read_wsgi_body"]

logger = logging.getLogger("tokenfuse.middleware")

#: How much of a request body is read to fingerprint it.
BODY_LIMIT = 1 << 20
#: Bodiless calls (caller, route and query) whose checks each breaker keeps: a client polls a
#: few endpoints, but there are many callers, and a path or a query may carry an id.
NAMES_KEPT = 256


def is_failure(status: int) -> bool:
    """Whether a response status is an error of the call (429 is not: back-pressure)."""
    return status >= 400 and status != 429


def _query(raw: Any) -> str:
    """The query string with its parameters sorted: the same arguments in any order."""
    text = raw.decode("latin-1") if isinstance(raw, bytes) else str(raw or "")
    if not text:
        return ""
    return "?" + urlencode(sorted(parse_qsl(text, keep_blank_values=True)))


class LoopCall:
    """One guarded request under watch: who, which call, and what the check found."""

    __slots__ = ("call", "identity", "needs_success", "noted")

    def __init__(self, identity: Identity, call: CallName, verdict: LoopVerdict | None) -> None:
        self.identity = identity
        self.call = call
        self.needs_success = verdict is not None and verdict.failures > 0
        self.noted = False

    def wants_note(self, status: int) -> bool:
        """Whether a response of ``status`` has a note to send: not for most calls (a
        success with no failures to end), which the ASGI shell then does not await."""
        if self.noted or status == 429:
            return False
        return self.needs_success or status >= 400  # ``is_failure``: 429 is ruled out above

    def outcome(self, status: int) -> tuple[bool, int] | None:
        """(failed, status) to note, or None: nothing to note (noted already, or a success
        with no failures to end, or a 429)."""
        if self.noted or status == 429:
            return None
        self.noted = True
        failed = is_failure(status)
        if not failed and not self.needs_success:
            return None
        return failed, status


class InboundLoops:
    """The breaker of one middleware: check a request, note its response."""

    def __init__(self, fuse: Fuse, policy: FailureLoopPolicy) -> None:
        self.breaker = LoopBreaker(fuse, policy)
        # Repeats are not reported inbound, so unless they are refused no send needs counting:
        # the check asks only "is this call tripped?", which a store's view may answer.
        self.local = policy.on_repeat == "event"
        # A bodiless call's name (its fingerprint, an HMAC, and its printable path) and its
        # check's operation depend on the caller, route and query alone: made once for them,
        # not on every request (bounded).
        self._bodiless = functools.lru_cache(maxsize=NAMES_KEPT)(self._bodiless_check)

    def prepare(
        self, identity: Identity, request: RequestView, query: Any, body: bytes | None
    ) -> LoopCheck:
        """The request's check, to send with its admission (``Fuse.admit_with``)."""
        breaker = self.breaker
        if body is None and isinstance(query, (bytes, str)):  # hashable: a cache key
            call, op = self._bodiless(
                breaker.fuse._key(identity), request.method, request.path, query
            )
            # ``breaker.prepare``'s check, its operation made already (one call fewer).
            return LoopCheck(call, op, perf_counter() if WATCHERS.decisions else 0.0)
        return breaker.prepare(identity, self.name(request, query, body), self.local)

    def _bodiless_check(
        self, key: str, method: str, path: str, query: bytes | str
    ) -> tuple[CallName, CheckLoops]:
        call = self._name(method, path, query, None)
        return call, CheckLoops(key, call.fingerprint, self.breaker.core, self.local)

    def concluded(
        self, identity: Identity, check: LoopCheck, verdict: LoopVerdict | None
    ) -> tuple[Decision | None, LoopCall]:
        """The decision on the check's verdict from the shared pipeline (None when the store
        failed or was skipped: the admission's decision counted that, and the call goes
        unchecked; None too for a verdict with nothing to refuse, which is only counted),
        and the watch of the call."""
        if verdict is None:
            return None, LoopCall(identity, check.call, None)
        if plain(verdict):  # most calls: no decision to act on (the metrics still count it)
            if check.started:  # observed (``passed`` counts it): else there is nothing to do
                self.breaker.passed(identity, check, verdict)
            return None, LoopCall(identity, check.call, verdict)
        decision = self.breaker.concluded(identity, check, verdict, report=False)
        return decision, LoopCall(identity, check.call, verdict)

    def name(self, request: RequestView, query: Any, body: bytes | None) -> CallName:
        """The call: route, query and body in its fingerprint; the route alone in messages
        (a query may carry a credential)."""
        return self._name(request.method, request.path, query, body)

    def _name(self, method: str, path: str, query: Any, body: bytes | None) -> CallName:
        return self.breaker.name(method, "", path + _query(query), body, shown=path)

    def check(self, identity: Identity, check: LoopCheck) -> tuple[Decision, LoopCall]:
        """The check on its own (lease mode): a round trip, or the store's local answer."""
        decision, verdict = self.breaker.check(identity, check.call, report=False, op=check.op)
        return decision, LoopCall(identity, check.call, verdict)

    async def acheck(self, identity: Identity, check: LoopCheck) -> tuple[Decision, LoopCall]:
        breaker = self.breaker
        decision, verdict = await breaker.acheck(identity, check.call, report=False, op=check.op)
        return decision, LoopCall(identity, check.call, verdict)

    def note(self, watch: LoopCall, status: int) -> None:
        outcome = watch.outcome(status)
        if outcome is None:
            return
        failed, code = outcome
        try:
            self.breaker.note(watch.identity, watch.call, failed, code)
        except StoreUnavailable:  # fail_closed: the response is on its way all the same
            logger.warning("tokenfuse: store unavailable, a failed call not counted")

    async def anote(self, watch: LoopCall, status: int) -> None:
        outcome = watch.outcome(status)
        if outcome is None:
            return
        failed, code = outcome
        try:
            await self.breaker.anote(watch.identity, watch.call, failed, code)
        except StoreUnavailable:
            logger.warning("tokenfuse: store unavailable, a failed call not counted")


def has_body(request: RequestView) -> bool:
    """Whether the request announces a body (a length other than 0, or chunks): none to
    read for most ``GET`` requests, which the ASGI shell then does not await."""
    length = request.header("content-length")
    if length is not None:
        return length.strip() not in ("", "0")
    return request.header("transfer-encoding") is not None


async def read_asgi_body(request: RequestView, receive: Receive) -> tuple[bytes | None, Receive]:
    """The request's body (its first ``BODY_LIMIT`` bytes), and the ``receive`` that hands
    the app every message as the server sent it."""
    if not has_body(request):
        return None, receive
    buffered = await read_body(receive, BODY_LIMIT)
    data = buffered.data
    if data is None:
        parts = (m.get("body", b"") for m in buffered.messages if m.get("type") == "http.request")
        data = b"".join(parts)[:BODY_LIMIT]
    return data, buffered.replay(receive)


class _Replayed(io.RawIOBase):
    """A ``wsgi.input`` that gives the bytes read already, then the rest of the original."""

    def __init__(self, head: bytes, rest: Any) -> None:
        self._head = io.BytesIO(head)
        self._rest = rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        size = len(buffer)
        data = self._head.read(size)
        if len(data) < size and self._rest is not None:
            more = self._rest.read(size - len(data))
            data += more or b""
        buffer[: len(data)] = data
        return len(data)


def read_wsgi_body(request: RequestView) -> bytes | None:
    """The request's body (its first ``BODY_LIMIT`` bytes); ``wsgi.input`` is replaced by
    one that gives the app the whole body all the same."""
    environ = request.raw
    if not has_body(request):
        return None
    stream = environ.get("wsgi.input")
    if stream is None:
        return None
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if length <= 0:
        return None  # no length (chunked): left to the app untouched, named by route alone
    try:
        head: bytes = stream.read(min(length, BODY_LIMIT))
    except Exception:  # a broken input stream is the app's to find, not ours
        return None
    rest = stream if length > len(head) else None
    environ["wsgi.input"] = io.BufferedReader(_Replayed(head, rest))
    return head


def status_of(line: str) -> int:
    """The code of a WSGI status line (``"404 Not Found"``); 500 when it has none."""
    try:
        return int(line.split(None, 1)[0])
    except (ValueError, IndexError):
        return 500


def iterable_closing(body: Iterable[bytes], done: Callable[[], None]) -> Iterable[bytes]:
    """``body`` as the server iterates it, with ``done`` called once when it is closed."""
    return _Closing(body, done)


class _Closing:
    def __init__(self, body: Iterable[bytes], done: Callable[[], None]) -> None:
        self._body = body
        self._chunks = iter(body)
        self._done = done

    def __iter__(self) -> _Closing:
        return self

    def __next__(self) -> bytes:
        return next(self._chunks)

    def close(self) -> None:
        try:
            close = getattr(self._body, "close", None)
            if close is not None:
                close()
        finally:
            self._done()
