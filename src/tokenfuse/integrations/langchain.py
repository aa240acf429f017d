"""Guard a LangChain chat model (``ChatOpenAI``, ``AzureChatOpenAI``, ``ChatAnthropic``).

Passing ``http_client=`` to ``ChatOpenAI`` is not enough: it guards only the sync path
(``ainvoke``/``astream`` use ``http_async_client``), and any custom client turns LangChain's
``stream_usage`` off, so a streaming agent reports no usage at all and loops unseen.
``guard_langchain`` swaps the model's own SDK clients, sync and async, for copies that send
through ``FuseTransport``/``AsyncFuseTransport`` (keeping base URL, key, timeouts and retries)
and turns ``stream_usage`` on. The SDKs let a refusal through untouched, so the agent's code
catches ``tokenfuse.FuseTripped`` (``LoopSuspected``, ``CeilingExceeded``) as it is, from
``invoke``, ``ainvoke``, ``stream``, ``astream`` and from a LangGraph agent built on the model.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, TypeVar

from .. import AsyncFuseTransport, ConfigurationError, Fuse, FuseTransport
from ._common import Key, load, seam_moved

__all__ = ["guard_langchain"]

M = TypeVar("M")

_SUPPORTED = {"langchain-openai": ">=1.7,<2", "langchain-anthropic": ">=1.7,<2"}


def guard_langchain(llm: M, *, fuse: Fuse | None = None, key: Key = None) -> M:
    """Send every call of ``llm`` through tokenfuse; returns ``llm`` itself, guarded in place.

    >>> from langchain_openai import ChatOpenAI                    # doctest: +SKIP
    >>> llm = guard_langchain(ChatOpenAI(model="gpt-5"))          # doctest: +SKIP
    >>> agent = create_react_agent(llm, tools)                     # doctest: +SKIP

    ``llm`` may also be a model already bound to tools (``llm.bind_tools(...)``): the model
    inside is guarded. Guard the model before handing it to the agent, or after: the agent
    holds the same object.

    Raises:
        ConfigurationError: ``llm`` is no supported chat model, or its package moved the
            clients this helper replaces.
    """
    model: Any = getattr(llm, "bound", llm)  # a RunnableBinding wraps the model it calls
    package = type(model).__module__.partition(".")[0]
    if package == "langchain_openai":
        _guard_openai(model, fuse, key)
    elif package == "langchain_anthropic":
        _guard_anthropic(model, fuse, key)
    else:
        raise ConfigurationError(
            f"guard_langchain guards ChatOpenAI, AzureChatOpenAI and ChatAnthropic, not "
            f"{type(model).__qualname__}; give other models a client built with FuseTransport"
        )
    return llm


def _guard_openai(model: Any, fuse: Fuse | None, key: Key) -> None:
    openai = load("openai", extra="langchain")
    if not all(hasattr(model, name) for name in ("root_client", "root_async_client")):
        raise seam_moved("langchain-openai", _SUPPORTED["langchain-openai"], "its SDK clients")
    if model.root_client is not None:  # None when only an async API key callable was given
        model.root_client = model.root_client.with_options(
            http_client=openai.DefaultHttpxClient(transport=FuseTransport(fuse=fuse, key=key))
        )
        model.client = model.root_client.chat.completions
    transport = AsyncFuseTransport(fuse=fuse, key=key)
    model.root_async_client = model.root_async_client.with_options(
        http_client=openai.DefaultAsyncHttpxClient(transport=transport)
    )
    model.async_client = model.root_async_client.chat.completions
    # A custom client turns LangChain's default off; without usage a stream is never counted.
    model.stream_usage = True


def _guard_anthropic(model: Any, fuse: Fuse | None, key: Key) -> None:
    anthropic = load("anthropic", extra="langchain")
    for name in ("_client", "_async_client"):
        # Both clients are cached properties: the guarded copy takes the cached value's place.
        if not isinstance(
            inspect.getattr_static(type(model), name, None), functools.cached_property
        ):
            raise seam_moved(
                "langchain-anthropic", _SUPPORTED["langchain-anthropic"], "its SDK clients"
            )
    sync_http = anthropic.DefaultHttpxClient(transport=FuseTransport(fuse=fuse, key=key))
    async_http = anthropic.DefaultAsyncHttpxClient(transport=AsyncFuseTransport(fuse=fuse, key=key))
    vars(model)["_client"] = model._client.with_options(http_client=sync_http)
    vars(model)["_async_client"] = model._async_client.with_options(http_client=async_http)
