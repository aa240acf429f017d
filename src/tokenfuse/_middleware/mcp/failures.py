"""The failure-loop breaker for tools: a stuck agent repeating the same failing call.

An agent that calls the same tool with the same arguments and gets an error, again and again,
is stuck, however cheap each call is: no rate or bucket sees it. The MCP middleware sees both
halves — the call going in and the error coming out (an ``isError`` tool result, a JSON-RPC
error, or an HTTP error status) — so it counts, per caller, the failures of each call
fingerprint (tool + canonical arguments). ``errors`` failures within the 60 s window trip the
breaker, and that call (same caller, tool and arguments) is refused, naming the tool, for
``cooldown`` seconds (doubling for each repeat trip within the hour, up to ``cooldown_max``).
A call with other arguments, or another tool, still goes through: that is progress, not a loop.

**Built on the existing primitives**, so it runs on every store (memory, Redis, Redis
Cluster), sync and async, and fails open with the fuse: a companion ``Fuse`` named
``<fuse>.tool-failures`` whose velocity policy is a manual ceiling of ``errors - 1`` per
minute, counting errors. ``record`` of one error is the counter; the latch a trip opens is
the block; ``gate`` before a call is the check. Keys are hashed and folded into ``slots``
per caller (``keys.py``) and expire with the store's TTL. A later, general failure-loop
breaker can take over the counting without changing what MCP mode asks of it: ``check``
before the call, ``failed`` after it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..._core.velocity import WINDOW_SECONDS, VelocityPolicy
from ..._errors import ConfigurationError, FuseTripped, StoreUnavailable
from ..._fuse import Fuse
from ..._identity import Identity
from .classify import Call
from .keys import companion, failure_key

__all__ = ["FailureLoopBreaker", "ToolFailureLoop", "ToolFailures"]

logger = logging.getLogger("tokenfuse.middleware")

_NEVER = 1e15  # a baseline no key reaches: the spike check never arms on error counts


@dataclass(frozen=True, slots=True)
class ToolFailures:
    """When repeated failures of one call trip the breaker.

    >>> ToolFailures(errors=5).errors
    5
    """

    errors: int = 3
    """Failures of the same call within 60 s that trip the breaker (at least 2)."""
    cooldown: float = 60.0
    """Seconds the tripped call is refused; doubles per repeat trip within an hour."""
    cooldown_max: float = 3_600.0
    slots: int = 256
    """Failure counters kept per caller; distinct failing calls beyond this share them."""

    def __post_init__(self) -> None:
        if isinstance(self.errors, bool) or not isinstance(self.errors, int) or self.errors < 2:
            raise ConfigurationError(
                f"errors must be an integer of at least 2, not {self.errors!r}"
            )
        if not (isinstance(self.slots, int) and 1 <= self.slots <= 65_536):
            raise ConfigurationError(
                f"slots must be an integer from 1 to 65536, not {self.slots!r}"
            )

    def velocity(self) -> VelocityPolicy:
        return VelocityPolicy(
            limit=self.errors - 1,
            min_baseline=_NEVER,
            cold_start_limit=None,
            cooldown=self.cooldown,
            cooldown_max=self.cooldown_max,
            unit="errors",
        )


class ToolFailureLoop(FuseTripped):
    """The same call (caller, tool, arguments) kept failing: it is refused for a while.

    ``tool`` names the tool (or prompt, or resource); ``rate`` is the failures counted in the
    last 60 s and ``limit`` the count that trips.
    """

    reason = "failure_loop"

    def __init__(
        self, *, tool: str, key: str, rate: float, limit: float, retry_after: float
    ) -> None:
        self.tool = tool
        super().__init__(key=key, rate=rate, limit=limit, retry_after=retry_after, unit="errors")

    def describe(self) -> str:
        return (
            f"failure loop: {self.tool!r} failed {self.limit:.0f} times within "
            f"{WINDOW_SECONDS:.0f} s with the same arguments for key {self.key} "
            f"(blocked for {self.retry_after:.0f} s)"
        )

    def as_dict(self) -> dict[str, object]:
        return {**super().as_dict(), "tool": self.tool}


class FailureLoopBreaker:
    """``check`` before a call, ``failed`` after an error: the breaker's two steps."""

    def __init__(self, fuse: Fuse, policy: ToolFailures) -> None:
        self.policy = policy
        self.fuse = companion(fuse, "tool-failures", policy.velocity())

    def _key(self, caller: Identity, call: Call) -> Identity:
        return failure_key(caller, call, self.policy.slots)

    async def check(self, caller: Identity, call: Call) -> ToolFailureLoop | None:
        """The refusal when this call's breaker is open; raises ``StoreUnavailable`` only
        when the fuse fails closed."""
        decision = await self.fuse.agate(self._key(caller, call))
        error = decision.error
        if decision.allowed or error is None:
            return None
        return ToolFailureLoop(
            tool=call.name,
            key=caller.label,
            rate=error.rate,
            limit=float(self.policy.errors),
            retry_after=error.retry_after,
        )

    async def failed(self, caller: Identity, call: Call) -> None:
        """Count one failure of ``call``; the one that reaches ``errors`` trips."""
        try:
            await self.fuse.arecord(self._key(caller, call), 1.0)  # a trip emits its event
        except StoreUnavailable:
            logger.warning("tokenfuse: store unavailable, a failure of %r not counted", call.name)
