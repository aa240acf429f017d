"""``FuseTransport`` and ``AsyncFuseTransport``: count LLM tokens on outbound httpx calls.

One call costs at most two store round trips: the gate before sending (is the key open?) and
the record after the response (add its tokens; this may open the key for the next call). A
refused call raises before a byte leaves the process; a call whose usage trips the key still
returns its (already paid for) response. Responses that carry no countable usage skip the
record.

Both classes work inside ``httpx`` 0.28 and ``httpx2`` 2.x clients: the library is taken from
the request, and its default transport is built on first use when no ``inner`` is given.
The logic is shared (``_Guard`` and ``Meter``, no I/O); the two classes differ only where they
call the inner transport and the store.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from .._errors import ConfigurationError
from .._events import logger
from .._fuse import Decision, Fuse, default_fuse
from .._identity import Identity
from .._usage import (
    ExtractorRegistry,
    ResponseHead,
    UsageReader,
    default_registry,
    reader_for_response,
)
from .compat import Flavor, body_if_read, flavor_of, header_dict
from .identity import KeyOption, KeyResolver
from .meter import FuseReport, Meter
from .refusal import for_sdks
from .stream import async_stream_type, sync_stream_type

__all__ = ["EXTENSION", "AsyncFuseTransport", "FuseTransport"]

#: The key of the ``FuseReport`` in ``response.extensions`` (and of per-request options in
#: ``request.extensions``: ``{"tokenfuse": {"key": "agent-7"}}``).
EXTENSION = "tokenfuse"


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


class _Guard:
    """What both transports share: identity, gate verdicts, readers, reports."""

    __slots__ = ("estimate", "fuse", "identify", "registry")

    def __init__(
        self,
        fuse: Fuse | None,
        key: KeyOption,
        registry: ExtractorRegistry | None,
        estimate: bool,
        *,
        sync: bool,
    ) -> None:
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
        self.fuse = fuse
        self.identify = KeyResolver(key)
        self.registry = registry if registry is not None else default_registry
        self.estimate = estimate

    @staticmethod
    def check(decision: Decision) -> None:
        """Raise the gate's refusal, in a form the loaded SDKs let through unwrapped."""
        error = decision.error
        if not decision.allowed and error is not None:
            raise for_sdks(error)

    def meter(
        self, request: Any, response: Any, identity: Identity, gate: Decision
    ) -> tuple[Meter, bytes | None]:
        """The meter of one response, reported in its extensions, and its body if already read.

        A response can come back from the inner transport already read (``MockTransport`` with
        ``content=``, a caching transport): the client will not iterate its stream, so the
        body is read from memory, where it is already decoded.
        """
        report = FuseReport(identity, gate)
        body = body_if_read(response)
        meter = Meter(identity, report, None)
        try:
            meter.read_with(self._reader(request, response, decoded=body is not None))
        except Exception as exc:  # a custom registry: its failure must not break the call
            meter.fail(exc)
        response.extensions[EXTENSION] = report
        return meter, body

    def _reader(self, request: Any, response: Any, *, decoded: bool) -> UsageReader | None:
        # `decoded`: the client already decoded the body, so its content-encoding is no more.
        headers = header_dict(response.headers)
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
        estimate: for streams that carry no usage, record an estimate from the generated text
            (flagged ``usage.estimated``) instead of leaving the amount unknown.

    Refusals raise the fuse's typed errors (``LoopSuspected``, ``CeilingExceeded``); the
    report of each call is in ``response.extensions["tokenfuse"]`` (a ``FuseReport``).
    """

    def __init__(
        self,
        inner: _InnerTransport | None = None,
        *,
        fuse: Fuse | None = None,
        key: KeyOption = None,
        registry: ExtractorRegistry | None = None,
        estimate: bool = False,
    ) -> None:
        self._guard = _Guard(fuse, key, registry, estimate, sync=True)
        self.fuse = self._guard.fuse
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
        guard = self._guard
        identity = guard.identify(request)
        gate = self.fuse.gate(identity)
        guard.check(gate)
        response = self._inner_for(flavor).handle_request(request)
        meter, body = guard.meter(request, response, identity, gate)
        if body is not None or not meter.reading:
            if body is not None:
                meter.feed(body)
            self._settle(meter, True)
        else:
            response.stream = sync_stream_type(flavor)(response.stream, meter, self._settle)
        return response

    def close(self) -> None:
        if self._inner is not None:
            self._inner.close()
        for made in self._made.values():
            made.close()

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

    def _settle(self, meter: Meter, complete: bool) -> None:
        amount = meter.finish(complete=complete)
        if amount is None:
            return
        try:
            decision = self.fuse.record(meter.identity, amount)
        except Exception as exc:
            _record_failed(exc)
            return
        meter.recorded(decision)


class AsyncFuseTransport(_AsyncBase):
    """The async form of ``FuseTransport``, for ``httpx.AsyncClient``/``httpx2.AsyncClient``.

    >>> client = httpx.AsyncClient(transport=AsyncFuseTransport())   # doctest: +SKIP

    Takes the same arguments as ``FuseTransport``; ``inner`` defaults to the library's
    ``AsyncHTTPTransport()`` and the fuse's store must have async methods.
    """

    def __init__(
        self,
        inner: _AsyncInnerTransport | None = None,
        *,
        fuse: Fuse | None = None,
        key: KeyOption = None,
        registry: ExtractorRegistry | None = None,
        estimate: bool = False,
    ) -> None:
        self._guard = _Guard(fuse, key, registry, estimate, sync=False)
        self.fuse = self._guard.fuse
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
        guard = self._guard
        identity = guard.identify(request)
        gate = await self.fuse.agate(identity)
        guard.check(gate)
        response = await self._inner_for(flavor).handle_async_request(request)
        meter, body = guard.meter(request, response, identity, gate)
        if body is not None or not meter.reading:
            if body is not None:
                meter.feed(body)
            await self._settle(meter, True)
        else:
            response.stream = async_stream_type(flavor)(response.stream, meter, self._settle)
        return response

    async def aclose(self) -> None:
        if self._inner is not None:
            await self._inner.aclose()
        for made in self._made.values():
            await made.aclose()

    def _inner_for(self, flavor: Flavor) -> _AsyncInnerTransport:
        if self._inner is not None:
            return self._inner
        made = self._made.get(flavor.name)
        if made is None:
            # No await between the check and the store: no other task can interleave.
            made = self._made[flavor.name] = flavor.async_http_transport()
        return made

    async def _settle(self, meter: Meter, complete: bool) -> None:
        amount = meter.finish(complete=complete)
        if amount is None:
            return
        try:
            decision = await self.fuse.arecord(meter.identity, amount)
        except Exception as exc:
            _record_failed(exc)
            return
        meter.recorded(decision)
