"""MCP mode's decisions, free of any protocol: what to check for an exchange, and the verdict.

``McpGate`` is what both MCP shells call — the ASGI one in front of a Streamable HTTP server
(``asgi.py``) and the mcp 2.x server-middleware hook (``hook.py``):

1. ``admit(plan, exchange, request)`` before the server runs the calls:

   - the failure-loop breaker of each call (a read: a blocked call takes nothing);
   - the caller's key: latch, bucket (``cost`` = the exchange's summed price) and call
     velocity weighted by that price, in the one store trip every guarded request makes;
   - caller × tool velocity for each call, on the companion fuse ``<fuse>.tools``.

   Each verdict goes through the middleware's own ``settle`` (so ``shadow``, ``refusal`` and
   the ``RateLimit`` / ``Retry-After`` headers behave as for any route); a refusal comes back
   as ``Admission.refused``, for the shell to answer in MCP's shape.
2. ``failed(plan, call)`` for each call the server answered with an error.

With a store, the tools/call path makes two or three store round trips before the call (the
breaker's gate, the caller's admit, the tool's admit) and one after a failed call; every
other MCP message makes none.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..._errors import ConfigurationError
from ..._fuse import Decision
from ..guard import InboundGuard, Plan
from ..reply import Reply
from ..request import RequestView
from .classify import Call, Classifier, Exchange, McpCost
from .failures import FailureLoopBreaker
from .keys import companion, tool_key
from .mode import McpMode
from .replies import Refused

__all__ = ["Admission", "McpGate"]

_KEPT_HEADERS = frozenset({"retry-after", "ratelimit", "ratelimit-policy"})


@dataclass(frozen=True, slots=True)
class Admission:
    """The verdict on one exchange.

    ``refused`` None: run it and add ``headers`` to the response. Otherwise answer with a
    refusal carrying ``headers`` (``Retry-After``, ``RateLimit``), or with ``custom``, the
    reply of the user's own ``refusal=`` function when one is configured.
    """

    refused: Refused | None
    headers: tuple[tuple[str, str], ...]
    custom: Reply | None = None


class McpGate:
    """The MCP checks on top of a middleware's ``InboundGuard`` (identity, tiers, shadow...)."""

    def __init__(self, guard: InboundGuard, mode: McpMode, cost: McpCost) -> None:
        if guard.count != "calls":
            raise ConfigurationError("mcp=True counts tool calls; it cannot take count='tokens'")
        self.guard = guard
        self.mode = mode
        self.classifier = Classifier(cost=cost, methods=mode.methods)
        fuse = guard.fuse
        self.tools = companion(fuse, "tools", fuse.velocity) if fuse.velocity else None
        self.breaker = FailureLoopBreaker(fuse, mode.failures) if mode.failures else None

    async def admit(self, plan: Plan, exchange: Exchange, request: RequestView) -> Admission:
        """Check an exchange with charged calls. Raises ``StoreUnavailable`` only when the
        fuse fails closed."""
        caller = plan.identity
        if self.breaker is not None:
            for call in exchange.calls:
                loop = await self.breaker.check(caller, call)
                if loop is not None:
                    refused = Decision(key=caller.label, allowed=False, error=loop)
                    return self._settle(plan, refused, request)
        cost = exchange.cost
        admitter = plan.leases or plan.fuse  # lease=True: from this process's lease
        decision = await admitter.aadmit(caller, cost=cost, amount=cost, bucket=plan.bucket)
        admission = self._settle(plan, decision, request)
        if admission.refused is not None or decision.degraded or self.tools is None:
            return admission
        for call in exchange.calls:
            verdict = await self.tools.aadmit(tool_key(caller, call), cost=0.0, amount=call.cost)
            if not verdict.allowed:
                # The RateLimit headers of a tool's refusal show the caller's bucket.
                tool_admission = self._settle(
                    plan, replace(verdict, bucket=decision.bucket), request
                )
                if tool_admission.refused is not None:
                    return tool_admission
        return admission

    async def failed(self, plan: Plan, call: Call) -> None:
        """The server answered ``call`` with an error: count it for the breaker."""
        if self.breaker is not None:
            await self.breaker.failed(plan.identity, call)

    def _settle(self, plan: Plan, decision: Decision, request: RequestView) -> Admission:
        outcome = self.guard.settle(plan, decision, request)
        reply = outcome.reply
        if reply is None:  # allowed, failing open, or shadow mode
            return Admission(None, outcome.headers)
        kept = tuple(item for item in reply.headers if item[0].lower() in _KEPT_HEADERS)
        custom = reply if self.guard.refusal is not None else None
        return Admission(decision.error, kept, custom)
