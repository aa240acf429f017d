"""``FuseTransport`` and ``AsyncFuseTransport``: count LLM tokens on outbound httpx calls.

One call goes through five steps, each in one place: **identify** the key it spends for
(``identity.KeyResolver``), **gate** it (``Fuse.gate``; a refusal raises before a byte leaves
the process, or in shadow mode is only logged: ``refusal.Gatekeeper``), **send** it (the inner
transport; an OpenAI-style stream is asked for its usage on the way, ``usage_option``),
**meter** the response
(``meter.Metering``: the usage side picks its reader, the report goes in its extensions) and
**settle** the usage (``_settle``: the amount is recorded once the body is read, at once or when
a stream ends or closes, with the call's failure-loop note in the same round trip; or both
handed to a ``Recorder``, ``record="background"``). So a call costs at most two store round
trips (on Redis the gate and the loop check are usually answered from the store's local view
of open keys, and background records and notes go in batches: then none at all), and a call
whose usage trips the key still returns its (already paid for) response. Responses that carry no
countable usage skip the record.

Both classes work inside ``httpx`` 0.28 and ``httpx2`` 2.x clients: the library is taken from
the request, and its default transport is built on first use when no ``inner`` is given.
They differ only where they do I/O: the inner transport and the store. Each refuses, with a
``ConfigurationError`` that names the other, to serve a client of the other kind.
"""

from __future__ import annotations

import threading
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Protocol

from .._errors import ConfigurationError
from .._events import logger
from .._fuse import Fuse, default_fuse
from .._loops import FailureLoopPolicy
from .._runs.ledger import Hold
from .._usage import ExtractorRegistry
from .._usage.request import ERROR_HEAD
from .budget_step import BudgetStep
from .compat import Flavor, endpoint_of, flavor_of
from .identity import KeyOption, KeyResolver
from .loop_step import LoopStep, LoopWatch
from .meter import Meter, Metering
from .recorder import Recorder
from .refusal import Gatekeeper
from .stream import (
    aread_head,
    async_replayed_type,
    async_stream_type,
    read_head,
    replayed_type,
    sync_stream_type,
)
from .usage_option import Sending, UsageOption

__all__ = ["AsyncFuseTransport", "FuseTransport"]


class _InnerTransport(Protocol):
    def handle_request(self, request: Any) -> Any: ...

    def close(self) -> None: ...


class _AsyncInnerTransport(Protocol):
    async def handle_async_request(self, request: Any) -> Any: ...

    async def aclose(self) -> None: ...


if TYPE_CHECKING:
    # For type checkers a FuseTransport is a transport of both libraries, so that
    # ``httpx.Client(transport=...)`` and ``httpx2.Client(transport=...)`` both check. At run
    # time it subclasses neither: the clients only call its methods, and anthropic 2.x refuses
    # any transport with an ``httpx`` (not ``httpx2``) class in its MRO.
    import httpx
    import httpx2

    class _SyncBase(httpx.BaseTransport, httpx2.BaseTransport):
        def handle_request(self, request: Any) -> Any: ...

    class _AsyncBase(httpx.AsyncBaseTransport, httpx2.AsyncBaseTransport):
        async def handle_async_request(self, request: Any) -> Any: ...

else:
    _SyncBase = _AsyncBase = object


def _serving_fuse(fuse: Fuse | None, *, sync: bool) -> Fuse:
    """``fuse`` (default: ``default_fuse()``), once it is known to serve this transport's face."""
    fuse = fuse if fuse is not None else default_fuse()
    if sync and not fuse.has_sync:
        raise ConfigurationError(
            f"{fuse.store!r} is async-only: use AsyncFuseTransport with an async client"
        )
    if not sync and not fuse.has_async:
        raise ConfigurationError(
            f"{fuse.store!r} is sync-only: use FuseTransport with a sync client"
        )
    if fuse.velocity is None:
        raise ConfigurationError("FuseTransport needs a fuse with a velocity policy")
    return fuse


RecordMode = Literal["inline", "background"]

#: ``failure_loops``' default: the breaker on, with its default policy.
_DEFAULT_LOOPS = FailureLoopPolicy()


def _loop_policy(policy: FailureLoopPolicy | None) -> FailureLoopPolicy | None:
    if policy is not None and not isinstance(policy, FailureLoopPolicy):
        raise ConfigurationError(
            f"failure_loops must be a FailureLoopPolicy or None, not {type(policy).__name__}"
        )
    return policy


def _recorder(fuse: Fuse, record: RecordMode) -> Recorder | None:
    if record == "background":
        return Recorder(fuse)
    if record != "inline":
        raise ConfigurationError(f'record must be "inline" or "background", not {record!r}')
    return None


def _wrong_client(transport: object) -> ConfigurationError:
    if isinstance(transport, FuseTransport):
        return ConfigurationError(
            "FuseTransport is a sync transport and this is an async client: use "
            "AsyncFuseTransport with httpx.AsyncClient or httpx2.AsyncClient"
        )
    return ConfigurationError(
        "AsyncFuseTransport is an async transport and this is a sync client: use "
        "FuseTransport with httpx.Client or httpx2.Client"
    )


def _settle_of(settle: Any, hold: Hold | None, watch: LoopWatch | None) -> Any:
    """The transport's settle step for one call: with its hold and its loop watch, if any."""
    if hold is None and watch is None:
        return settle
    return partial(settle, hold=hold, watch=watch)


def _record_failed(exc: Exception) -> None:
    # Only a fail_closed fuse raises here, and it has reported the outage already. The
    # response is paid for and must reach the caller; the next gate enforces fail_closed.
    logger.debug("tokenfuse: recording usage failed, the call goes on: %r", exc)


class FuseTransport(_SyncBase):
    """An httpx/httpx2 transport that counts the LLM tokens of every call and stops loops.

    >>> client = httpx.Client(transport=FuseTransport())        # doctest: +SKIP
    >>> client = httpx2.Client(transport=FuseTransport())       # doctest: +SKIP
    >>> redis = RedisStore.from_url("redis://localhost")       # doctest: +SKIP
    >>> shared = FuseTransport(fuse=Fuse(redis))                # doctest: +SKIP

    Args:
        inner: the transport that really sends (default: the HTTP transport of the client's
            library, ``httpx.HTTPTransport()`` or ``httpx2.HTTPTransport()``, made on first use).
        fuse: the fuse to count in (default: ``default_fuse()``, the embedded store).
        key: who calls are counted for, instead of the credential they carry: a name, an
            ``Identity``, or a callable of the request (returning None falls back).
            ``tokenfuse.scope(...)`` and ``request.extensions["tokenfuse"]["key"]`` win over it.
        registry: where usage readers come from (default: the built-in providers plus
            whatever was registered on ``tokenfuse``'s default registry).
        estimate: when a response reports no usage, record an estimate (flagged
            ``usage.estimated``): the text the request sent plus the text a stream that was
            not asked for usage generated, at 4 bytes a token. ``False`` leaves the amount
            unknown and records nothing. Either way such calls are counted in ``fuse.stats``.
        inject_usage: add ``"stream_options": {"include_usage": true}`` to OpenAI-style
            chat/completions streaming requests that do not ask for their usage, so that their
            streams report it (they end with one more chunk, with empty ``choices``). A server
            that refuses the option gets the request again as it was made.
        record: ``"inline"`` records each call's usage before its response is handed over;
            ``"background"`` hands it over at once and records in batches off the caller's
            path (``recorder``: one round trip per batch, flushed on ``close()``).
        shadow: decide, count and report, but never refuse: a call the gate would refuse is
            sent anyway and logged (at most a line a second), as the middleware's shadow mode
            does. Default: ``TOKENFUSE_SHADOW`` (off).
        failure_loops: the failure-loop breaker's policy (``FailureLoopPolicy``): the same
            call failing again and again, a conversation stuck on a failing tool call, the
            same request sent again and again. On by default; ``None`` turns it off.

    Refusals raise the fuse's typed errors (``LoopSuspected``, ``CeilingExceeded``,
    ``FailureLoop``, and ``BudgetExceeded`` inside ``tokenfuse.run``: ``budget_step``); the
    report of each call is in ``response.extensions["tokenfuse"]`` (a ``FuseReport``).
    """

    def __init__(
        self,
        inner: _InnerTransport | None = None,
        *,
        fuse: Fuse | None = None,
        key: KeyOption = None,
        registry: ExtractorRegistry | None = None,
        estimate: bool = True,
        inject_usage: bool = True,
        record: RecordMode = "inline",
        shadow: bool | None = None,
        failure_loops: FailureLoopPolicy | None = _DEFAULT_LOOPS,
    ) -> None:
        self.fuse = _serving_fuse(fuse, sync=True)
        self._identify = KeyResolver(key)
        self._metering = Metering(self.fuse, registry, estimate)
        self._gate = Gatekeeper(shadow)
        self._recorder = _recorder(self.fuse, record)
        policy = _loop_policy(failure_loops)
        self._loops = LoopStep(self.fuse, policy, self._gate, self._recorder)
        self._budget = BudgetStep(self.fuse, self._gate.shadow)  # run budgets (budget_step)
        self._usage_option = UsageOption(inject_usage, self.fuse)
        self._inner = inner
        self._made: dict[str, _InnerTransport] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> FuseTransport:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        self.close()

    def handle_request(self, request: Any) -> Any:
        flavor = flavor_of(request)
        identity = self._identify(request)
        where = endpoint_of(request.url)  # read once, for the loop check and the meter
        # One round trip before sending: the velocity gate, the run budgets' reservations
        # (budget_step) and the failure-loop check (loop_step); none when a RedisStore's
        # open-key view answers the gate and the check (on_repeat="event") and no run is
        # bound. A refusing gate releases the reservations; a refusing loop check, or a send
        # that raises, releases them here.
        check = self._loops.prepare(identity, request, where)
        also, body = ((check.op,), check.body) if check is not None else ((), None)
        gate, hold, found = self._budget.gate_and_reserve(identity, request, also, body)
        self._gate.check(gate, request)
        watch = None
        try:
            watch = self._loops.conclude(identity, check, found and found[0], request)
            response, sent = self._send(flavor, request)
        except BaseException:
            self._budget.settle(hold, None)
            self._loops.raised(watch)  # a send that raised is a send all the same
            raise
        settle = _settle_of(self._settle, hold, watch)
        meter = self._metering.start(sent, response, identity, gate, where)
        # The failure-loop watch (loop_step) sees the body before the settle, which takes
        # the call's note to send with its record: at once for a read body, else at the end
        # of the stream (the metered stream feeds the watch each chunk, then settles).
        if meter.streaming:
            response.stream = sync_stream_type(flavor)(response.stream, meter, settle)
            self._loops.after(watch, response, flavor)
        else:
            self._loops.after(watch, response, flavor)
            settle(meter, True)
        return response

    def close(self) -> None:
        if self._recorder is not None:
            self._recorder.close()
        if self._inner is not None:
            self._inner.close()
        for made in self._made.values():
            made.close()

    async def __aenter__(self) -> None:
        raise _wrong_client(self)

    async def handle_async_request(self, request: Any) -> Any:
        raise _wrong_client(self)

    async def aclose(self) -> None:
        pass  # nothing was opened through the wrong face; closing must not hide its error

    def _send(self, flavor: Flavor, request: Any) -> tuple[Any, Sending]:
        inner = self._inner_for(flavor)
        sending = self._usage_option.prepare(request, flavor)
        response = inner.handle_request(sending.request)
        if not self._usage_option.may_be_refused(sending, response):
            return response, sending
        head, rest = read_head(response.stream, ERROR_HEAD)
        if not self._usage_option.refused(sending, response, head):
            response.stream = replayed_type(flavor)(head, rest, response.stream)
            return response, sending
        response.stream.close()
        return inner.handle_request(request), sending.as_made()

    def _inner_for(self, flavor: Flavor) -> _InnerTransport:
        if self._inner is not None:
            return self._inner
        made = self._made.get(flavor.name)
        if made is None:
            with self._lock:
                made = self._made.get(flavor.name)
                if made is None:
                    made = self._made[flavor.name] = flavor.http_transport()
        return made

    def _settle(
        self,
        meter: Meter,
        complete: bool,
        hold: Hold | None = None,
        watch: LoopWatch | None = None,
    ) -> None:
        amount = meter.finish(complete=complete)
        note = self._loops.take(watch, meter.streaming)  # the failure-loop note (loop_step)
        if self._recorder is not None:
            self._budget.settle(hold, meter.report.usage)
            if amount is not None or note is not None:
                self._recorder.submit(meter, amount, note)
            return
        # -- inline: the record, the run budgets' settlements and the note in one trip --
        also = () if note is None else (note.op,)
        inline = None if amount is None else (meter.identity, amount)
        recorded, decision, found = self._budget.settle(hold, meter.report.usage, inline, also)
        try:
            if recorded:
                meter.report.record = decision
            elif amount is not None:
                meter.report.record, found = self.fuse.record_with(meter.identity, amount, also)
            elif note is not None:
                note.send()
                return
        except Exception as exc:
            _record_failed(exc)
            return
        if note is not None:
            note.decided(found[0] if found else None)


class AsyncFuseTransport(_AsyncBase):
    """The async form of ``FuseTransport``, for ``httpx.AsyncClient``/``httpx2.AsyncClient``.

    >>> client = httpx.AsyncClient(transport=AsyncFuseTransport())   # doctest: +SKIP

    Takes the same arguments as ``FuseTransport``; ``inner`` defaults to the library's
    ``AsyncHTTPTransport()`` and the fuse's store must have async methods (and a sync face
    too with ``record="background"``, whose worker is a thread).
    """

    def __init__(
        self,
        inner: _AsyncInnerTransport | None = None,
        *,
        fuse: Fuse | None = None,
        key: KeyOption = None,
        registry: ExtractorRegistry | None = None,
        estimate: bool = True,
        inject_usage: bool = True,
        record: RecordMode = "inline",
        shadow: bool | None = None,
        failure_loops: FailureLoopPolicy | None = _DEFAULT_LOOPS,
    ) -> None:
        self.fuse = _serving_fuse(fuse, sync=False)
        self._identify = KeyResolver(key)
        self._metering = Metering(self.fuse, registry, estimate)
        self._gate = Gatekeeper(shadow)
        self._recorder = _recorder(self.fuse, record)
        policy = _loop_policy(failure_loops)
        self._loops = LoopStep(self.fuse, policy, self._gate, self._recorder)
        self._budget = BudgetStep(self.fuse, self._gate.shadow)  # run budgets (budget_step)
        self._usage_option = UsageOption(inject_usage, self.fuse)
        self._inner = inner
        self._made: dict[str, _AsyncInnerTransport] = {}

    async def __aenter__(self) -> AsyncFuseTransport:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        await self.aclose()

    async def handle_async_request(self, request: Any) -> Any:
        flavor = flavor_of(request)
        identity = self._identify(request)
        where = endpoint_of(request.url)  # as in FuseTransport.handle_request
        # One round trip before sending, as in FuseTransport.handle_request.
        check = self._loops.prepare(identity, request, where)
        also, body = ((check.op,), check.body) if check is not None else ((), None)
        gate, hold, found = await self._budget.agate_and_reserve(identity, request, also, body)
        self._gate.check(gate, request)
        watch = None
        try:
            watch = self._loops.conclude(identity, check, found and found[0], request)
            response, sent = await self._send(flavor, request)
        except BaseException:
            await self._budget.asettle(hold, None)
            await self._loops.araised(watch)
            raise
        settle = _settle_of(self._settle, hold, watch)
        meter = self._metering.start(sent, response, identity, gate, where)
        # as in FuseTransport.handle_request: the loop watch first, then the settle
        if meter.streaming:
            response.stream = async_stream_type(flavor)(response.stream, meter, settle)
            await self._loops.aafter(watch, response, flavor)
        else:
            await self._loops.aafter(watch, response, flavor)
            await settle(meter, True)
        return response

    async def aclose(self) -> None:
        if self._recorder is not None:
            self._recorder.close()  # a join of at most FLUSH_WAIT: the worker is a thread
        if self._inner is not None:
            await self._inner.aclose()
        for made in self._made.values():
            await made.aclose()

    def __enter__(self) -> None:
        raise _wrong_client(self)

    def handle_request(self, request: Any) -> Any:
        raise _wrong_client(self)

    def close(self) -> None:
        pass  # nothing was opened through the wrong face; closing must not hide its error

    async def _send(self, flavor: Flavor, request: Any) -> tuple[Any, Sending]:
        inner = self._inner_for(flavor)
        sending = self._usage_option.prepare(request, flavor)
        response = await inner.handle_async_request(sending.request)
        if not self._usage_option.may_be_refused(sending, response):
            return response, sending
        head, rest = await aread_head(response.stream, ERROR_HEAD)
        if not self._usage_option.refused(sending, response, head):
            response.stream = async_replayed_type(flavor)(head, rest, response.stream)
            return response, sending
        await response.stream.aclose()
        return await inner.handle_async_request(request), sending.as_made()

    def _inner_for(self, flavor: Flavor) -> _AsyncInnerTransport:
        if self._inner is not None:
            return self._inner
        made = self._made.get(flavor.name)
        if made is None:
            # No await between the check and the store: no other task can interleave.
            made = self._made[flavor.name] = flavor.async_http_transport()
        return made

    async def _settle(
        self,
        meter: Meter,
        complete: bool,
        hold: Hold | None = None,
        watch: LoopWatch | None = None,
    ) -> None:
        amount = meter.finish(complete=complete)
        note = self._loops.take(watch, meter.streaming)
        if self._recorder is not None:
            await self._budget.asettle(hold, meter.report.usage)
            if amount is not None or note is not None:
                self._recorder.submit(meter, amount, note)  # never waits (inline only when full)
            return
        also = () if note is None else (note.op,)
        inline = None if amount is None else (meter.identity, amount)
        recorded, decision, found = await self._budget.asettle(
            hold, meter.report.usage, inline, also
        )
        try:
            if recorded:
                meter.report.record = decision
            elif amount is not None:
                meter.report.record, found = await self.fuse.arecord_with(
                    meter.identity, amount, also
                )
            elif note is not None:
                await note.asend()
                return
        except Exception as exc:
            _record_failed(exc)
            return
        if note is not None:
            note.decided(found[0] if found else None)
