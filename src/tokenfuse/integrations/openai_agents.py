"""Guard the OpenAI Agents SDK (``openai-agents``): its default OpenAI client.

``guard_openai_agents()`` copies the OpenAI client the SDK would use (or the one given) onto an
HTTP client that sends through ``AsyncFuseTransport``, and makes it the SDK's default. Both
model APIs go through it (Responses, and Chat Completions with
``set_default_openai_api("chat_completions")``), streamed or not. The openai SDK lets a
refusal through untouched and the Runner re-raises it, so ``Runner.run`` raises
``tokenfuse.FuseTripped`` (``LoopSuspected``, ``CeilingExceeded``) itself, long before the
SDK's own ``max_turns`` (10 by default) raises ``MaxTurnsExceeded``.

A Chat Completions stream carries its usage only when asked. The SDK asks by itself for
OpenAI's own URL only; for any other server ``FuseTransport`` asks on its behalf (its
``inject_usage``, on by default), so those streams are counted too.
"""

from __future__ import annotations

from typing import Any

from .. import AsyncFuseTransport, Fuse
from ._common import Key, load, seam_moved

__all__ = ["guard_openai_agents"]

_SUPPORTED = ">=0.24,<1"


def guard_openai_agents(
    client: Any = None,
    *,
    fuse: Fuse | None = None,
    key: Key = None,
    use_for_tracing: bool = True,
) -> Any:
    """Make a guarded OpenAI client the Agents SDK's default; returns that client.

    >>> guard_openai_agents()                                      # doctest: +SKIP
    >>> result = await Runner.run(agent, "go")                      # doctest: +SKIP

    Args:
        client: the ``openai.AsyncOpenAI`` to copy (base URL, key, timeouts, retries); by
            default one built as the SDK builds it, from ``OPENAI_API_KEY`` and
            ``OPENAI_BASE_URL``.
        fuse, key: as for ``AsyncFuseTransport``.
        use_for_tracing: passed to ``agents.set_default_openai_client``: whether traces are
            uploaded with this client's API key.

    Raises:
        ConfigurationError: ``openai-agents`` is not installed, or moved
            ``set_default_openai_client``.
    """
    agents = load("agents", extra="openai-agents")
    openai = load("openai", extra="openai-agents")
    set_default = getattr(agents, "set_default_openai_client", None)
    if set_default is None:
        raise seam_moved("openai-agents", _SUPPORTED, "set_default_openai_client")
    base = client if client is not None else openai.AsyncOpenAI()
    transport = AsyncFuseTransport(fuse=fuse, key=key)
    guarded = base.with_options(http_client=openai.DefaultAsyncHttpxClient(transport=transport))
    set_default(guarded, use_for_tracing=use_for_tracing)
    return guarded
