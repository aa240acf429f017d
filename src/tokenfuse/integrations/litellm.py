"""Guard every HTTP client LiteLLM makes, for every provider, in the SDK and in a ``Router``.

LiteLLM builds its clients in three places, and ``guard_litellm()`` guards each one:

* sync OpenAI-SDK providers (OpenAI, Azure, OpenAI-compatible servers) take
  ``litellm.client_session``;
* sync providers on LiteLLM's own HTTP handler (Anthropic, Gemini, Bedrock, ...) take
  ``litellm.sync_transport``;
* every async client, of either kind, gets its transport from
  ``AsyncHTTPHandler.create_async_transport``, which has no setting, so the guard wraps it
  (and ``close()`` puts it back). Clients are built per event loop, as LiteLLM does.

Clients LiteLLM cached before the call are dropped, so the next call builds guarded ones.

**Refusals.** LiteLLM wraps whatever a transport raises in its own exception, mapped from the
error's ``status_code`` (500 when there is none, and always 500 on some streaming paths). A
500 is retried, and a ``Router`` cools the deployment down, so *other* agents on that router
get ``No deployments available``. So a refusal is raised here as a ``litellm.BadRequestError``
(400) too: LiteLLM passes its own exceptions through, or maps this one to a 400, which the
Router neither retries nor counts against the deployment. Either way the caller gets a
``litellm.BadRequestError`` that is, or is caused by, the refusal; ``tokenfuse.unwrap_refusals()``
raises the refusal itself::

    try:
        with tokenfuse.unwrap_refusals():
            litellm.completion(model="anthropic/claude-sonnet-4-5", messages=messages)
    except tokenfuse.FuseTripped as trip:
        stop_the_agent(trip)

A retry that LiteLLM still makes (``num_retries`` on a bare ``completion``) is refused at the
gate again: it sends nothing.

**Identity.** By default every call LiteLLM makes is counted as ``"litellm"``, not per
credential: a Router whose deployments hold different API keys would otherwise give one agent
one budget per deployment. Name each agent with ``tokenfuse.scope("agent-42")`` (it wins over
``key=``); ``key=None`` counts per credential, as ``FuseTransport`` does.
"""

from __future__ import annotations

from typing import Any

from .. import AsyncFuseTransport, ConfigurationError, Fuse, FuseTransport, FuseTripped
from ._common import Key, load, seam_moved

__all__ = ["LiteLLMGuard", "as_litellm_error", "guard_litellm"]

_SUPPORTED = ">=1.110,<2"

#: The module-level settings the guard fills, and the lazily built clients it drops.
_SETTINGS = ("client_session", "sync_transport")
_LAZY_CLIENTS = ("module_level_client", "module_level_aclient")
#: ``AsyncHTTPHandler``'s factory of async transports, under both of its names.
_ASYNC_FACTORIES = ("create_async_transport", "_create_async_transport")

_kinds: dict[type[FuseTripped], type[FuseTripped]] = {}


def _reduce_as_refusal(self: FuseTripped) -> tuple[object, ...]:
    # The mixed class exists only in this process: it pickles as the refusal it was made from.
    refusal: FuseTripped = vars(self)["_tokenfuse_refusal"]
    return refusal.__reduce__()


def as_litellm_error(refusal: FuseTripped) -> FuseTripped:
    """``refusal`` as an instance of both its own class and ``litellm.BadRequestError``.

    A 400 is the client error that LiteLLM neither retries in a Router nor holds against the
    deployment (429, 401, 404, 408 and 5xx cool it down). LiteLLM passes its own exception
    types through untouched, and maps anything else to one by its ``status_code``: either way
    the caller gets a ``litellm.BadRequestError`` that is, or is caused by, the refusal.
    """
    litellm = load("litellm", extra="litellm")
    plain = type(refusal)
    kind = _kinds.get(plain)
    if kind is None:
        namespace = {"__module__": plain.__module__, "__reduce__": _reduce_as_refusal}
        kind = _kinds[plain] = type(plain.__name__, (plain, litellm.BadRequestError), namespace)
    mixed = kind.__new__(kind)
    vars(mixed).update(vars(refusal), _tokenfuse_refusal=refusal)
    litellm.BadRequestError.__init__(mixed, str(refusal), model=None, llm_provider="tokenfuse")
    return mixed


class _Refusing:
    """A sync transport raising its ``FuseTransport``'s refusals as LiteLLM errors."""

    def __init__(self, inner: FuseTransport) -> None:
        self._inner = inner

    def handle_request(self, request: Any) -> Any:
        try:
            return self._inner.handle_request(request)
        except FuseTripped as refusal:
            raise as_litellm_error(refusal) from None

    def close(self) -> None:
        self._inner.close()


class _AsyncRefusing:
    """The async form of ``_Refusing``."""

    def __init__(self, inner: AsyncFuseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: Any) -> Any:
        try:
            return await self._inner.handle_async_request(request)
        except FuseTripped as refusal:
            raise as_litellm_error(refusal) from None

    async def aclose(self) -> None:
        await self._inner.aclose()


class LiteLLMGuard:
    """What ``guard_litellm()`` installed; ``close()`` (or the end of a ``with`` block) puts
    LiteLLM's own clients back."""

    def __init__(self, litellm: Any, handler: type, fuse: Fuse | None, key: Key) -> None:
        self._litellm = litellm
        self._handler = handler
        self._factories = {name: vars(handler)[name] for name in _ASYNC_FACTORIES}
        self._transport = _Refusing(FuseTransport(fuse=fuse, key=key))
        self._client = load("httpx", extra="litellm").Client(transport=self._transport)
        self.closed = False
        litellm.client_session = self._client
        litellm.sync_transport = self._transport
        build = self._factories[_ASYNC_FACTORIES[0]].__func__

        def guarded_async_transport(*args: Any, **kwargs: Any) -> _AsyncRefusing:
            inner = build(*args, **kwargs)
            return _AsyncRefusing(AsyncFuseTransport(inner, fuse=fuse, key=key))

        for name in _ASYNC_FACTORIES:
            setattr(self._handler, name, staticmethod(guarded_async_transport))
        self._forget_clients()

    def close(self) -> None:
        """Put LiteLLM's own clients back; the next call builds unguarded ones."""
        if self.closed:
            return
        self.closed = True
        for name in _SETTINGS:
            setattr(self._litellm, name, None)
        for name, factory in self._factories.items():
            setattr(self._handler, name, factory)
        self._forget_clients()
        self._client.close()

    async def aclose(self) -> None:
        """Close the async clients LiteLLM built while guarded (on the running event loop),
        then ``close()``: for an asyncio application, which would otherwise leave their
        connections open."""
        cleanup = load("litellm.llms.custom_httpx.async_client_cleanup", extra="litellm")
        if not self.closed:
            await cleanup.close_litellm_async_clients()
        self.close()

    def _forget_clients(self) -> None:
        self._litellm.in_memory_llm_clients_cache.flush_cache()
        for name in _LAZY_CLIENTS:  # rebuilt on first use, through whichever factory is set
            vars(self._litellm).pop(name, None)

    def __enter__(self) -> LiteLLMGuard:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> LiteLLMGuard:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def guard_litellm(*, fuse: Fuse | None = None, key: Key = "litellm") -> LiteLLMGuard:
    """Count the tokens of every call LiteLLM makes in this process, and stop loops.

    >>> guard = guard_litellm()                                    # doctest: +SKIP
    >>> with tokenfuse.scope("agent-42"):                           # doctest: +SKIP
    ...     router.completion(model="claude", messages=messages)

    Args:
        fuse: the fuse to count in (default: ``tokenfuse.default_fuse()``); it needs both sync
            and async store methods (``MemoryStore`` and ``RedisStore`` have them).
        key: who calls are counted for when no ``tokenfuse.scope()`` names an agent (default:
            ``"litellm"``, one budget for the process, whatever deployment a Router picks).

    Returns the ``LiteLLMGuard``; ``close()`` it to put LiteLLM's own clients back.

    Raises:
        ConfigurationError: LiteLLM is not installed, a client setting this guard fills is
            already set (a guard is active, or the application set its own), or this LiteLLM
            version moved the hooks used here.
    """
    litellm = load("litellm", extra="litellm")
    handlers = load("litellm.llms.custom_httpx.http_handler", extra="litellm")
    handler = getattr(handlers, "AsyncHTTPHandler", None)
    if handler is None or not all(
        isinstance(vars(handler).get(name), staticmethod) for name in _ASYNC_FACTORIES
    ):
        raise seam_moved("litellm", _SUPPORTED, "AsyncHTTPHandler.create_async_transport")
    if not hasattr(litellm, "in_memory_llm_clients_cache"):
        raise seam_moved("litellm", _SUPPORTED, "its client cache")
    taken = [
        name for name in (*_SETTINGS, "aclient_session") if getattr(litellm, name, None) is not None
    ]
    if taken:
        raise ConfigurationError(
            f"litellm.{taken[0]} is already set (by an active guard_litellm(), or by the "
            "application); close that guard, or unset it, before guarding LiteLLM"
        )
    return LiteLLMGuard(litellm, handler, fuse, key)
