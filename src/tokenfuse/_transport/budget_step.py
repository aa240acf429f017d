"""The run-budget step of an outbound call (``tokenfuse.run``): reserve, then settle.

When runs are bound around the call (``_runs.context``), before it is sent the call

1. carries the innermost run's id in the ``TokenFuse-Run`` header, so a tool server that
   guards its own LLM calls counts them against the same run (its middleware binds it);
2. reserves its estimate against every bound run, all or nothing (``_runs.ledger``): the
   request's ``max_tokens`` / ``max_output_tokens`` / ``max_completion_tokens`` (or the run's
   ``call_estimate`` when it names none) plus its body's size at 4 bytes a token, and that
   many tokens' price in dollars. A refusal raises ``BudgetExceeded`` before a byte leaves.

When the metering has the call's usage (at once, or when a stream ends or is closed), the
reservation is *settled* with what the response reports (its estimate when it reports none:
the call happened, so it counts); a call that raised is *released*. Without runs bound this
step costs one context-variable read.

Everything is store operations (``Reserve``, ``Settle``): before the call, the reservations go
in one pipeline with the velocity gate (``Fuse.gate_with``), so a call inside runs costs
one round trip before it is sent; after it, the settlements go with the velocity record
and the call's failure-loop note (``Fuse.record_with``), one more. Both fail open like every
decision.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from .._errors import BudgetExceeded, StoreUnavailable
from .._events import logger
from .._fuse import Decision, Fuse
from .._identity import Identity
from .._runs import pricing
from .._runs.context import RUN_HEADER, Bound, bound_runs, run_event
from .._runs.ledger import Hold, hold_for
from .._stores.ops import Op
from .._usage import Usage
from .._usage.estimate import tokens_for
from .refusal import for_sdks, through_anthropic_sdk
from .usage_option import sent_body

__all__ = ["RUN_HEADER", "BudgetStep"]

_MAX_KEYS = ("max_tokens", "max_output_tokens", "max_completion_tokens", "maxOutputTokens")
_MAX_BODY = 8 << 20  # bodies larger than this are not parsed for a model or a maximum
_MODEL_IN_PATH = re.compile(r"/models/([^/:?]+)")


class _Call:
    """What the step learned of a request: its model, provider and estimate in tokens."""

    __slots__ = ("input", "model", "output", "tokens")

    def __init__(self, request: Any, call_estimate: float, parsed_body: Any = None) -> None:
        body = sent_body(request)
        parsed = parsed_body if isinstance(parsed_body, dict) else _json_object(body)
        model = parsed.get("model")
        if not isinstance(model, str):
            found = _MODEL_IN_PATH.search(str(request.url.path))
            model = found.group(1) if found else None
        self.model: str | None = model[:200] if model else None
        maximum = _maximum(parsed)
        # Only what looks like an LLM call reserves: a call to a tool, a web page, ... would
        # reserve an LLM call's worth of a run for nothing. Its usage, if it reports any,
        # is still counted when it settles.
        self.input = self.output = 0.0
        if self.model is not None or maximum is not None:
            self.input = tokens_for(len(body or b""))
            self.output = call_estimate if maximum is None else maximum
        self.tokens = self.input + self.output


def _json_object(body: bytes | None) -> dict[str, Any]:
    if not body or len(body) > _MAX_BODY or body[:1] != b"{":
        return {}
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _maximum(parsed: dict[str, Any]) -> float | None:
    config = parsed.get("generationConfig")
    for where in (parsed, config if isinstance(config, dict) else {}):
        for key in _MAX_KEYS:
            value = where.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
                return float(value)
    return None


def _may_limit_usd(run: Bound) -> bool:
    """Whether the run may have a usd limit (else the call's price is not needed yet)."""
    handle = run.handle
    if handle is None or handle.last is None:
        return True  # joined by id, limits unknown here
    return handle.usd_limit >= 0 or handle.last.usd_limit >= 0


def _settle_failed(exc: Exception) -> None:
    """A settlement raised: never the caller's problem (the response is theirs), never silent."""
    if isinstance(exc, StoreUnavailable):  # a fail_closed fuse, which reported the outage
        logger.debug("tokenfuse: settling a run budget failed: %r", exc)
    else:
        logger.error("tokenfuse: settling a run budget failed", exc_info=exc)


class BudgetStep:
    """Run budgets in one transport: ``reserve`` before sending, ``settle`` after."""

    __slots__ = ("fuse", "shadow")

    def __init__(self, fuse: Fuse, shadow: bool) -> None:
        self.fuse = fuse
        self.shadow = shadow  # refusals are logged, never raised (``FuseTransport(shadow=)``)

    def _hold(self, request: Any, body: Any) -> Hold | None:
        runs = bound_runs()
        if not runs:
            return None
        innermost: Bound = runs[-1]
        request.headers[RUN_HEADER] = innermost.run_id
        call = _Call(request, innermost.call_estimate, body)
        priced = any(_may_limit_usd(run) for run in runs)
        usd = 0.0
        if priced and call.tokens:
            usd = self._usd(call.model, None, call.input, call.output, warn=True) or 0.0
        hold = hold_for(runs, self.fuse, call.tokens, usd)
        hold.model = call.model
        hold.priced = priced
        return hold

    def gate_and_reserve(
        self, identity: Identity, request: Any, also: Sequence[Op[Any]] = (), body: Any = None
    ) -> tuple[Decision, Hold | None, list[Any] | None]:
        """The velocity gate, the call's reservations on every bound run and ``also`` (the
        failure-loop check), in one round trip to the transport's store (``Fuse.gate_with``);
        runs kept in another store get a pipeline of their own. Raises ``BudgetExceeded``
        when a run cannot afford the call; a gate that refuses wins (its refusal is the
        transport's to raise), and then nothing stays reserved. Returns the gate's decision,
        the hold, and the results of ``also`` (None when the store was not asked or failed:
        the gate's decision has counted that). ``body``: the request body as the loop step
        parsed it (``LoopCheck.body``), so that the estimate does not parse it again."""
        hold = self._hold(request, body)
        if hold is None or not hold.tokens:
            decision, found = self.fuse.gate_with(identity, also)
            return decision, hold, found
        gate: Decision | None = None
        also_found: list[Any] | None = None
        results: list[list[Any] | None] = []
        for group in hold.groups:
            ops = hold.reserve_ops(group)
            if gate is None and group.fuse.store is self.fuse.store:
                gate, found = self.fuse.gate_with(identity, [*also, *ops])
                also_found, found = _split(found, len(also))
            else:
                found = group.fuse.run_guarded(ops)
            results.append(found)
        if gate is None:
            gate, also_found = self.fuse.gate_with(identity, also)
        refusal, releases = self._verdict(hold, gate, results)
        for fuse, ops in releases:
            fuse.run_guarded(ops)
        self._refuse(refusal, request)
        return gate, hold, also_found

    async def agate_and_reserve(
        self, identity: Identity, request: Any, also: Sequence[Op[Any]] = (), body: Any = None
    ) -> tuple[Decision, Hold | None, list[Any] | None]:
        hold = self._hold(request, body)
        if hold is None or not hold.tokens:
            decision, found = await self.fuse.agate_with(identity, also)
            return decision, hold, found
        gate: Decision | None = None
        also_found: list[Any] | None = None
        results: list[list[Any] | None] = []
        for group in hold.groups:
            ops = hold.reserve_ops(group)
            if gate is None and group.fuse.store is self.fuse.store:
                gate, found = await self.fuse.agate_with(identity, [*also, *ops])
                also_found, found = _split(found, len(also))
            else:
                found = await group.fuse.arun_guarded(ops)
            results.append(found)
        if gate is None:
            gate, also_found = await self.fuse.agate_with(identity, also)
        refusal, releases = self._verdict(hold, gate, results)
        for fuse, ops in releases:
            await fuse.arun_guarded(ops)
        self._refuse(refusal, request)
        return gate, hold, also_found

    def _verdict(
        self, hold: Hold, gate: Decision, results: list[list[Any] | None]
    ) -> tuple[BudgetExceeded | None, list[tuple[Fuse, list[Op[Any]]]]]:
        """The run's refusal (or None) and the reservations to give back: all of them when
        the gate refused (its refusal is the one raised)."""
        refusal, releases = hold.judge(results)
        if not (gate.allowed or self.shadow):
            refusal, releases = None, releases + hold.releases()
        return refusal, releases

    def _refuse(self, refusal: BudgetExceeded | None, request: Any) -> None:
        if refusal is None:
            return
        if self.shadow:  # sent all the same: nothing is held, its settlement counts it
            logger.warning("tokenfuse shadow mode, would refuse %s: %s", request.url, refusal)
            return
        raise for_sdks(refusal) if through_anthropic_sdk(request.headers) else refusal

    def settle(
        self,
        hold: Hold | None,
        usage: Usage | None,
        record: tuple[Identity, float] | None = None,
        also: Sequence[Op[Any]] = (),
    ) -> tuple[bool, Decision | None, list[Any] | None]:
        """Replace the reservation by what the call spent (``usage``; None: nothing, it was
        no LLM call or it failed), and with ``record`` (who, amount) also record the call's
        velocity, and run ``also`` (the call's failure-loop note), in the same round trip
        (``Fuse.record_with``). Whether it recorded (and ran ``also``), the record's
        decision (None if it failed) and the results of ``also`` (None: not run, or the
        store failed). Never raises: the response is the caller's."""
        if hold is None or hold.done:
            return False, None, None
        hold.done = True
        tokens, usd = self._spent(hold, usage)
        if not (tokens or usd or hold.holds_any()):
            return False, None, None  # nothing held, nothing spent: nothing to tell the store
        recorded, decision, also_found = False, None, None
        try:
            for group in hold.groups:
                ops = hold.settle_ops(group, tokens, usd)
                if record is not None and group.fuse.store is self.fuse.store:
                    recorded, (who, spent), record = True, record, None
                    decision, found = self.fuse.record_with(who, spent, [*ops, *also])
                    found, also_found = _split(found, len(ops))
                else:
                    found = group.fuse.run_guarded(ops)
                hold.settled(group, found)
        except Exception as exc:
            _settle_failed(exc)
        return recorded, decision, also_found

    async def asettle(
        self,
        hold: Hold | None,
        usage: Usage | None,
        record: tuple[Identity, float] | None = None,
        also: Sequence[Op[Any]] = (),
    ) -> tuple[bool, Decision | None, list[Any] | None]:
        if hold is None or hold.done:
            return False, None, None
        hold.done = True
        tokens, usd = self._spent(hold, usage)
        if not (tokens or usd or hold.holds_any()):
            return False, None, None
        recorded, decision, also_found = False, None, None
        try:
            for group in hold.groups:
                ops = hold.settle_ops(group, tokens, usd)
                if record is not None and group.fuse.store is self.fuse.store:
                    recorded, (who, spent), record = True, record, None
                    decision, found = await self.fuse.arecord_with(who, spent, [*ops, *also])
                    found, also_found = _split(found, len(ops))
                else:
                    found = await group.fuse.arun_guarded(ops)
                hold.settled(group, found)
        except Exception as exc:
            _settle_failed(exc)
        return recorded, decision, also_found

    def _spent(self, hold: Hold, usage: Usage | None) -> tuple[float, float]:
        if usage is None:
            return 0.0, 0.0  # no LLM call was read (or it raised): give the reservation back
        if usage.total is None:
            return hold.tokens, hold.usd  # it happened, its usage is unknown: the estimate
        total = usage.total
        output = usage.output if usage.output is not None else total
        input_ = usage.input if usage.input is not None else max(total - output, 0.0)
        usd = self._usd(hold.model, usage.provider, input_, output, warn=hold.priced)
        return total, usd or 0.0

    def _usd(
        self, model: str | None, provider: str | None, input_: float, output: float, *, warn: bool
    ) -> float | None:
        """The call's price; an unknown model is reported (once) when a dollar limit may
        apply: a run limited in tokens only counts dollars for information."""
        price = pricing.cost(model, provider, input=input_, output=output)
        if price is None and warn and pricing.unknown_model(model):
            detail = (
                f"no price known for model {model or '(none named)'!r}: its calls count "
                "against run budgets in tokens only"
            )
            run_event(self.fuse, "price_unknown", model or "", detail)
        return price


def _split(found: list[Any] | None, count: int) -> tuple[list[Any] | None, list[Any] | None]:
    """A shared pipeline's results: the first ``count`` (``also``), then the rest."""
    if found is None:
        return None, None
    return found[:count], found[count:]
