"""Getting a refusal raised inside a transport through an LLM SDK to the agent's code.

What the SDKs do with an exception raised by their HTTP transport (checked against the real
packages in ``tests/transport/test_sdks.py``):

* **openai 3.x** re-raises anything that is not an ``httpx2.RequestError`` (or timeout) as it
  is, without retrying: ``except LoopSuspected`` works unchanged.
* **anthropic 2.x** wraps every exception that is not an ``AnthropicError`` in
  ``APIConnectionError`` (``raise ... from err``) and *retries* it (2 retries with back-off
  by default) before raising the wrapper. ``except LoopSuspected`` would never match.
* Older Stainless-generated SDKs (groq, openai 1.x) wrap and retry every exception.

So a refusal of a request made by the anthropic SDK (its headers say so: a user agent
``Anthropic/Python ...``, ``AsyncAnthropic/...``, ``AnthropicBedrock/...``, or the SDKs'
``x-stainless-lang`` with ``anthropic-version``) is raised as an instance of a subclass of the
refusal *and* of ``anthropic.AnthropicError``: anthropic then lets it through untouched (no
wrapping, no retry, no back-off sleep), and ``except LoopSuspected`` works with it too. Every
other request gets the plain refusal, so that ``except anthropic.AnthropicError`` around an
openai call cannot swallow it and ``type(exc) is LoopSuspected`` holds.
For SDKs that wrap everything, ``unwrap_refusals()`` finds the refusal in the ``__cause__``
chain and raises it. Retries can never spend tokens either way: every retry passes the gate
again, and the key stays open, so no byte of it leaves the process.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .._errors import FuseTripped, reduce_as
from .._events import logger
from .._fuse import Decision
from .._throttle import Throttle

__all__ = [
    "Gatekeeper",
    "find_refusal",
    "for_sdks",
    "raise_if_refused",
    "through_anthropic_sdk",
    "unwrap_refusals",
]

# (module, exception base): SDKs that pass their own errors through and wrap all others.
_PASS_THROUGH = (("anthropic", "AnthropicError"),)
# The Stainless-made SDKs send "<client class>/Python <version>" as their user agent.
_SDK_AGENT = re.compile(r"(?:Async)?(\w+)/Python\b")

_mixed: dict[tuple[type[FuseTripped], tuple[type[Exception], ...]], type[FuseTripped]] = {}


def _sdk_bases() -> tuple[type[Exception], ...]:
    bases: list[type[Exception]] = []
    for module_name, name in _PASS_THROUGH:
        module = sys.modules.get(module_name)
        base = getattr(module, name, None) if module is not None else None
        if isinstance(base, type) and issubclass(base, Exception):
            bases.append(base)
    return tuple(bases)


def _reduce_as_plain(self: FuseTripped) -> tuple[object, ...]:
    # The mixed class exists only in this process; it pickles as the plain tokenfuse refusal.
    plain: type[FuseTripped] = type(self)._plain  # type: ignore[attr-defined]
    return reduce_as(self, plain)


def for_sdks(error: FuseTripped) -> FuseTripped:
    """``error`` as an instance that the loaded SDKs pass through unwrapped."""
    bases = _sdk_bases()
    if not bases:
        return error
    plain = type(error)
    kind = _mixed.get((plain, bases))
    if kind is None:
        namespace = {
            "__module__": plain.__module__,
            "__qualname__": plain.__qualname__,
            "__reduce__": _reduce_as_plain,
            "_plain": plain,
        }
        kind = _mixed[(plain, bases)] = type(plain.__name__, (plain, *bases), namespace)
    mixed = kind.__new__(kind)
    mixed.__dict__.update(error.__dict__)
    Exception.__init__(mixed, *error.args)
    return mixed


def through_anthropic_sdk(headers: Any) -> bool:
    """Whether a request with these headers was made by the anthropic SDK."""
    agent = _SDK_AGENT.match(headers.get("user-agent", ""))
    if agent is not None:
        return agent.group(1).startswith("Anthropic")
    return "x-stainless-lang" in headers and "anthropic-version" in headers


def raise_if_refused(gate: Decision, request: Any) -> None:
    """``gate.raise_if_refused()``; for the anthropic SDK's requests, in a form it lets through."""
    error = gate.error
    if not gate.allowed and error is not None:
        raise for_sdks(error) if through_anthropic_sdk(request.headers) else error


def find_refusal(exc: BaseException) -> FuseTripped | None:
    """The tokenfuse refusal that ``exc`` is, or wraps (through ``__cause__``/``__context__``)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, FuseTripped):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


@contextmanager
def unwrap_refusals() -> Iterator[None]:
    """Raise the tokenfuse refusal hidden inside an SDK's wrapper exception.

    For SDKs that wrap every transport error in their own (groq, openai 1.x)::

        try:
            with tokenfuse.unwrap_refusals():
                client.chat.completions.create(...)
        except tokenfuse.LoopSuspected as exc:
            stop_the_agent(exc)

    openai 3.x and anthropic 2.x need no help: the refusal reaches ``except`` as it is.
    """
    try:
        yield
    except FuseTripped:
        raise
    except Exception as exc:
        refusal = find_refusal(exc)
        if refusal is None:
            raise
        raise refusal from None


class Gatekeeper:
    """What a transport does with its gate's decision: raise the refusal, or in shadow mode
    (``shadow=True``, or ``TOKENFUSE_SHADOW``) let the call go and log what it would have done."""

    __slots__ = ("_log", "shadow")

    def __init__(self, shadow: bool | None) -> None:
        from .._settings import current

        self.shadow = current().shadow if shadow is None else bool(shadow)
        self._log = Throttle(1.0)

    def check(self, gate: Decision, request: Any) -> None:
        if gate.allowed or gate.error is None:
            return
        if not self.shadow:
            raise_if_refused(gate, request)
        held = self._log.take()
        if held is not None:
            logger.warning(
                "tokenfuse shadow mode, would refuse %s %s: %s (%s)%s",
                request.method, request.url, gate.error.reason, gate.error,
                f"; {held} more held back" if held else "",
            )  # fmt: skip
