"""The failure-loop breaker for tools: a stuck agent repeating the same failing call.

An agent that calls the same tool with the same arguments and gets an error, again and again,
is stuck, however cheap each call is: no rate or bucket sees it. The MCP middleware sees both
halves — the call going in and the error coming out (an ``isError`` tool result, a JSON-RPC
error, or an HTTP error status) — so it counts, per caller, the failures of each call
fingerprint (tool + canonical arguments). ``errors`` failures within 60 s trip the breaker,
and that call (same caller, tool and arguments) is refused, naming the tool, for ``cooldown``
seconds (doubling for each repeat trip within the hour, up to ``cooldown_max``). A call with
other arguments, or another tool, still goes through: that is progress, not a loop.

**The generic failure-loop breaker does the counting** (``tokenfuse._loops``, the rule in
``_core/loops.py``): ``check`` before a call is its ``CheckLoops``, ``failed`` after an error
its ``NoteLoop``, on the fuse's own store (memory, Redis, Redis Cluster), sync and async,
failing open with the fuse. The call's fingerprint is keyed with the deployment secret; the
caller's ``slots`` most recent failing calls are remembered, in one string beside its state.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..._errors import ConfigurationError, FuseTripped, StoreUnavailable
from ..._fuse import Fuse
from ..._identity import Identity
from ..._loops import CallName, FailureLoopPolicy, LoopBreaker
from .classify import Call

__all__ = ["FailureLoopBreaker", "ToolFailureLoop", "ToolFailures"]

logger = logging.getLogger("tokenfuse.middleware")

#: Seconds the failures of one call are counted over.
WINDOW_SECONDS = 60.0


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
    slots: int = 16
    """Failing calls remembered per caller (at most 1000); the least recently seen go first,
    a refused one last."""

    def __post_init__(self) -> None:
        if isinstance(self.errors, bool) or not isinstance(self.errors, int) or self.errors < 2:
            raise ConfigurationError(
                f"errors must be an integer of at least 2, not {self.errors!r}"
            )
        if not (isinstance(self.slots, int) and 1 <= self.slots <= 1_000):
            raise ConfigurationError(f"slots must be an integer from 1 to 1000, not {self.slots!r}")
        self.policy()  # the cooldowns are checked there

    def policy(self) -> FailureLoopPolicy:
        """The generic breaker's policy: repeats are never refused (an MCP client may call a
        tool the same way often, and succeed)."""
        return FailureLoopPolicy(
            failures=self.errors,
            window=WINDOW_SECONDS,
            cooldown=self.cooldown,
            cooldown_max=self.cooldown_max,
            max_calls=self.slots,
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
        self.loops = LoopBreaker(fuse, policy.policy())

    def _name(self, call: Call) -> CallName:
        # The classifier's digest of method, tool and canonical arguments, keyed again with
        # the deployment secret: no argument reaches the store.
        return self.loops.name("MCP", "", f"{call.method} {call.name}", call.fingerprint.encode())

    async def check(self, caller: Identity, call: Call) -> ToolFailureLoop | None:
        """The refusal when this call's breaker is open; raises ``StoreUnavailable`` only
        when the fuse fails closed."""
        decision, verdict = await self.loops.acheck(
            caller, self._name(call), tool=call.name, report=False
        )
        if decision.allowed or decision.error is None or verdict is None:
            return None
        return ToolFailureLoop(
            tool=call.name,
            key=caller.label,
            rate=verdict.count,
            limit=float(self.policy.errors),
            retry_after=max(verdict.retry_after, 0.0),
        )

    async def failed(self, caller: Identity, call: Call) -> None:
        """Count one failure of ``call``; the one that reaches ``errors`` trips (and reports a
        ``failure_loop`` event)."""
        try:
            await self.loops.anote(caller, self._name(call), True)
        except StoreUnavailable:
            logger.warning("tokenfuse: store unavailable, a failure of %r not counted", call.name)
