"""Guard a Pydantic AI model or provider (OpenAI, Anthropic, Google, and the other providers
that own an HTTP client).

A Pydantic AI provider owns the HTTP client of its SDK and re-creates it when a run starts on
another event loop (each ``run_sync`` has its own). ``guard_pydantic_ai`` gives the provider a
guarded client and a factory of guarded clients, through the same hook the provider uses to
re-create its own, so every client it ever uses sends through ``AsyncFuseTransport``. The
SDKs let a refusal through untouched: ``agent.run``/``run_sync``/``run_stream`` raise
``tokenfuse.FuseTripped`` (``LoopSuspected``, ``CeilingExceeded``) itself.

A provider that was handed an ``http_client`` (or an SDK client) by the application cannot
be guarded this way: build that client with ``transport=AsyncFuseTransport()`` instead.
"""

from __future__ import annotations

from typing import Any, TypeVar

from .. import AsyncFuseTransport, ConfigurationError, Fuse
from ._common import Key, load, seam_moved

__all__ = ["guard_pydantic_ai"]

_SUPPORTED = ">=2.68,<3"

T = TypeVar("T")


def guard_pydantic_ai(model_or_provider: T, *, fuse: Fuse | None = None, key: Key = None) -> T:
    """Send every call of a Pydantic AI model (or provider) through tokenfuse; returns it,
    guarded in place.

    >>> model = OpenAIChatModel("gpt-5", provider=OpenAIProvider())   # doctest: +SKIP
    >>> agent = Agent(guard_pydantic_ai(model), tools=[...])          # doctest: +SKIP

    Raises:
        ConfigurationError: it is neither a model nor a provider with an HTTP client of its
            own, or this Pydantic AI version moved the provider's client hooks.
    """
    providers = load("pydantic_ai.providers", extra="pydantic-ai")
    base = providers.Provider
    provider: Any = getattr(model_or_provider, "provider", model_or_provider)
    if not isinstance(provider, base):
        raise ConfigurationError(
            f"guard_pydantic_ai takes a Pydantic AI model or provider, not {provider!r}"
        )
    if not hasattr(base, "_http_client_factory") or not hasattr(base, "_own_http_client"):
        raise seam_moved("pydantic-ai-slim", _SUPPORTED, "Provider._http_client_factory")
    own = provider._own_http_client
    if own is None or type(provider)._set_http_client is base._set_http_client:
        raise ConfigurationError(
            f"{type(provider).__name__} uses an HTTP client it was given (or none it can "
            "replace): build that client with transport=AsyncFuseTransport() instead"
        )
    library, timeout, headers = type(own), own.timeout, own.headers

    def guarded_client() -> Any:
        # The provider's own kind of client (httpx2 or httpx), with its timeout and headers.
        transport = AsyncFuseTransport(fuse=fuse, key=key)
        return library(transport=transport, timeout=timeout, headers=headers)

    client = guarded_client()
    provider._http_client_factory = guarded_client
    provider._own_http_client = client
    provider._set_http_client(client)
    return model_or_provider
