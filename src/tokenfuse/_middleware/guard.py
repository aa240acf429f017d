"""Inbound: the protocol-free half of the middleware — what to check, and what to answer.

``InboundGuard`` turns a request into a ``Plan`` (who, which tier, what cost), a ``Decision``
into an ``Outcome`` (headers for the response and, counting tokens, the request's ``Report``;
or a refusal), and a finished ``Report`` into a record in the store. The ASGI and WSGI shells
only carry these through their protocols and make the store calls (``aadmit`` or ``admit``:
the admission and the failure-loop check in one round trip; ``arecord`` or ``record``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any

from .._core.bucket import BucketPolicy
from .._core.lease import LeasePolicy
from .._errors import ConfigurationError, FuseTripped, StoreUnavailable
from .._fuse import Decision, Fuse
from .._identity import Identity
from .._leases import Leases
from .._loops import LoopCheck
from .._settings import current as current_settings
from .._stores.ops import Admit, Op
from .._throttle import Throttle
from .clients import ClientAddress
from .defaults import default_inbound_fuse
from .identify import ANONYMOUS, bearer_or_api_key
from .loops import InboundLoops, LoopCall
from .options import InboundOptions, cost_rule, exclude_rule, identify_rule, tiers_rule
from .reply import Headers, Reply, delay_seconds, rate_limit_headers, refused
from .report import DECISION_KEY, REPORT_KEY, Report
from .request import RequestView

__all__ = ["Admission", "InboundGuard", "Outcome", "Plan"]

logger = logging.getLogger("tokenfuse.middleware")


# Plan, Admission and Outcome are made for every request and never changed: not frozen, as
# frozen dataclasses pay a setattr per field (``Decision`` in ``_fuse.py`` does the same).
@dataclass(slots=True)
class Plan:
    """What one guarded request will be checked for."""

    fuse: Fuse
    identity: Identity
    bucket: BucketPolicy | None  # the caller's tier, None for the fuse's own bucket
    cost: float
    amount: float  # recorded into the velocity window at admission (0 with count="tokens")
    leases: Leases | None = None  # admit from leases (``lease=True``), else from the fuse

    def admit(self) -> Decision:
        leases = self.leases
        if leases is not None:
            return leases.admit(
                self.identity, cost=self.cost, amount=self.amount, bucket=self.bucket
            )
        return self.fuse._decide(self.identity, self._admit_op(), self.fuse._admit_decision)

    def _admit_op(self) -> Admit:
        """``Fuse._admit_op``'s operation, made here: the identity is one already (no
        ``Identity.of``), and the numbers were checked once, by the options (``cost_rule``:
        a finite, non-negative float; ``amount``: 1.0 or 0.0), so not again per request."""
        fuse = self.fuse
        return Admit(fuse._key(self.identity), self.cost, self.amount, fuse.velocity,
                     self.bucket or fuse.bucket)  # fmt: skip

    # The a-prefixed steps return the fuse's (or the leases') coroutine for the caller to
    # await, rather than awaiting it in one of their own: a coroutine more per request would
    # be made, and every suspension on the store's socket passes through each one. For the
    # same reason the fuse's ``_adecide`` is returned, not ``Fuse.aadmit``'s coroutine around it.
    def aadmit(self) -> Awaitable[Decision]:
        leases = self.leases
        if leases is not None:
            return leases.aadmit(
                self.identity, cost=self.cost, amount=self.amount, bucket=self.bucket
            )
        return self.fuse._adecide(self.identity, self._admit_op(), self.fuse._admit_decision)

    def admit_with(self, ops: Sequence[Op[Any]]) -> tuple[Decision, list[Any] | None]:
        """``admit`` from the fuse, with ``ops`` in the same round trip (``Fuse.admit_with``'s
        steps, as ``admit`` takes ``Fuse.admit``'s)."""
        fuse = self.fuse
        return fuse._decide_with(self.identity, self._admit_op(), ops, fuse._admit_decision)

    def aadmit_with(self, ops: Sequence[Op[Any]]) -> Awaitable[tuple[Decision, list[Any] | None]]:
        fuse = self.fuse
        return fuse._adecide_with(self.identity, self._admit_op(), ops, fuse._admit_decision)


@dataclass(slots=True)
class Admission:
    """A request's admission, and its failure-loop check (None: the breaker is off).

    ``sent``: the check went to the store with the admission (direct mode), and ``found`` is
    its verdict (None: the store failed or was skipped; the admission's decision counted it).
    Not sent (``lease=True``: the admission is local), the check is asked on its own: a round
    trip, or an answer of the store's open-key view (``CheckLoops.local``, ``loops.py``).
    """

    decision: Decision
    check: LoopCheck | None = None
    sent: bool = False
    found: Any = None


@dataclass(slots=True)
class Outcome:
    """``reply`` set: refuse with it. Otherwise call the app, add ``headers`` to its response,
    and (``count="tokens"``) keep ``report`` active while it runs."""

    reply: Reply | None
    headers: Headers = ()
    report: Report | None = None


class InboundGuard:
    """The options of one ``TokenFuse`` / ``TokenFuseWSGI``, checked once, applied per request.

    Holds configuration and caches only: nothing about any one request is kept here.

    >>> guard = InboundGuard(InboundOptions(exclude=["/health"]))
    >>> from tokenfuse._middleware.request import AsgiRequest
    >>> guard.plan(AsgiRequest({"path": "/health"})) is None
    True
    """

    def __init__(self, options: InboundOptions) -> None:
        self.fuse = options.fuse if options.fuse is not None else default_inbound_fuse()
        if options.count == "tokens" and self.fuse.velocity is None:
            raise ConfigurationError("count='tokens' needs a fuse with a velocity policy")
        self.anonymous = options.anonymous
        self.count = options.count
        #: What an admission records into the velocity window (tokens are recorded later).
        self._amount = 1.0 if options.count == "calls" else 0.0
        # TOKENFUSE_SHADOW / configure(shadow=True): a dry run of the whole deployment.
        self.shadow = bool(options.shadow) or current_settings().shadow
        self.refusal = options.refusal
        self.policy_name = options.policy_name
        #: The tokens response header, lower-cased: the shells strip it from responses.
        self.tokens_header = options.tokens_header.lower()
        identify = options.identify if options.identify is not None else bearer_or_api_key
        self._identify = identify_rule(identify)
        self._cost_of = cost_rule(options.cost)
        self._excluded = exclude_rule(options.exclude)
        self._tier_of = tiers_rule(options.tiers)
        self._client = ClientAddress(options.trusted_proxies)
        self._shadow_log = Throttle(1.0)
        #: The leases calls are admitted from (``lease=True``), or None: each call asks the store.
        self.leases: Leases | None = None
        if options.lease:
            lease = options.lease if isinstance(options.lease, LeasePolicy) else LeasePolicy()
            self.leases = Leases(self.fuse, lease)
        loops = options.failure_loops
        self.loops = InboundLoops(self.fuse, loops) if loops is not None else None
        #: What the fuse's store answers without a round trip (``RedisStore.known``), or None.
        self._known = self.fuse._known

    # -- per request -------------------------------------------------------------------------

    def plan(self, request: RequestView) -> Plan | None:
        """What to check for this request; None when it is not guarded."""
        excluded, tier_of = self._excluded, self._tier_of  # None: the option asks nothing
        if excluded is not None and excluded(request):
            return None
        identity = self._identify(request) or self._nobody(request)
        if identity is None:
            return None
        tier = tier_of(request, identity) if tier_of is not None else None
        return Plan(self.fuse, identity, tier, self._cost_of(request), self._amount, self.leases)

    def settle(self, plan: Plan, decision: Decision, request: RequestView) -> Outcome:
        """Headers for an allowed call, or the refusal (none of either when failing open).

        The decision is filed in the scope / environ under ``DECISION_KEY``, and a call that
        goes ahead while counting tokens gets its ``Report`` there, under ``REPORT_KEY``.
        """
        request.raw[DECISION_KEY] = decision
        if decision.degraded:
            return self._go_ahead(request, ())
        error = decision.error
        if decision.allowed or error is None:
            return self._go_ahead(request, self._rate_headers(plan, decision, None))
        reply, headers = self._refusal(plan, decision, error, request)
        return Outcome(reply) if reply is not None else self._go_ahead(request, headers)

    def _refusal(
        self, plan: Plan, decision: Decision, error: FuseTripped, request: RequestView
    ) -> tuple[Reply | None, Headers]:
        """The reply refusing the request, or (shadow mode) None and the headers to add."""
        retry = delay_seconds(error.retry_after)
        headers = self._rate_headers(plan, decision, retry)
        if self.shadow:
            self._log_shadow(request, error)
            return None, headers
        headers = (("Retry-After", str(retry)), *headers)
        if self.refusal is not None:
            return self.refusal(error, request).with_defaults(headers), headers
        return refused(error, headers), headers

    # -- admission, with the failure-loop breaker's check (loops.py) in the same round trip ----

    def admit(self, plan: Plan, request: RequestView, body: bytes | None) -> Admission:
        """Admit the request and check it for loops, in one round trip (``body``: what the
        breaker fingerprints, read before admission)."""
        loops = self.loops
        if loops is None:
            return Admission(plan.admit())
        check = loops.prepare(plan.identity, request, _query_of(request), body)
        if plan.leases is not None:
            return Admission(plan.admit(), check)
        found = self._known_alone(check)
        if found is not None:
            decision = plan.admit()
            return Admission(decision, check, True, None if decision.degraded else found)
        decision, results = plan.admit_with((check.op,))
        return Admission(decision, check, True, results[0] if results else None)

    async def aadmit(self, plan: Plan, request: RequestView, body: bytes | None) -> Admission:
        loops = self.loops
        if loops is None:
            return Admission(await plan.aadmit())
        check = loops.prepare(plan.identity, request, _query_of(request), body)
        if plan.leases is not None:
            return Admission(await plan.aadmit(), check)
        found = self._known_alone(check)
        if found is not None:
            decision = await plan.aadmit()
            return Admission(decision, check, True, None if decision.degraded else found)
        decision, results = await plan.aadmit_with((check.op,))
        return Admission(decision, check, True, results[0] if results else None)

    def _known_alone(self, check: LoopCheck) -> Any:
        """The check's verdict when the store answers it without a round trip (its open-key
        view), else None. Then the admission goes alone, as ``Fuse.admit_with`` would send it
        (``Fuse._known_alone``), asked here so that the request skips that call's layers;
        the view's answer is dropped when the admission fails (``degraded``), as there."""
        known = self._known
        return None if known is None else known(check.op)

    def check_loops(
        self, plan: Plan, admission: Admission, request: RequestView
    ) -> tuple[LoopCall | None, Reply | None]:
        """For an admitted request: the watch of this call, or the reply refusing it as a
        loop. Decided on the verdict that came with the admission; in lease mode, asked now
        (a round trip, or the store's local view: ``loops.py``, "Round trips")."""
        loops, check = self.loops, admission.check
        if loops is None or check is None:
            return None, None
        if admission.sent:
            decision, watch = loops.concluded(plan.identity, check, admission.found)
            if decision is None:  # most calls: nothing to refuse
                return watch, None
        else:
            decision, watch = loops.check(plan.identity, check)
        return watch, self._loop_reply(plan, decision, request)

    async def acheck_loops(
        self, plan: Plan, admission: Admission, request: RequestView
    ) -> tuple[LoopCall | None, Reply | None]:
        loops, check = self.loops, admission.check
        if loops is None or check is None:
            return None, None
        if admission.sent:
            decision, watch = loops.concluded(plan.identity, check, admission.found)
            if decision is None:
                return watch, None
        else:
            decision, watch = await loops.acheck(plan.identity, check)
        return watch, self._loop_reply(plan, decision, request)

    def _loop_reply(
        self, plan: Plan, decision: Decision | None, request: RequestView
    ) -> Reply | None:
        if decision is None:
            return None
        error = decision.error
        if decision.allowed or decision.degraded or error is None:
            return None
        return self._refusal(plan, decision, error, request)[0]

    def record(self, plan: Plan, report: Report) -> None:
        """Record what the handler reported, once the response is complete."""
        if (total := report.total) > 0:
            try:
                plan.fuse.record(plan.identity, total)
            except StoreUnavailable:
                _not_recorded(total)

    async def arecord(self, plan: Plan, report: Report) -> None:
        """``record`` for the ASGI shell."""
        if (total := report.total) > 0:
            try:
                await plan.fuse.arecord(plan.identity, total)
            except StoreUnavailable:
                _not_recorded(total)

    # -- machinery -----------------------------------------------------------------------------

    def _nobody(self, request: RequestView) -> Identity | None:
        """Who a request without an identity is counted as (None: it is not guarded)."""
        if self.anonymous == "allow":
            return None
        if self.anonymous == "client":
            return self._client(request) or ANONYMOUS  # no peer address: a Unix socket
        return ANONYMOUS

    def _go_ahead(self, request: RequestView, headers: Headers) -> Outcome:
        if self.count != "tokens":
            return Outcome(None, headers)
        report = Report()
        request.raw[REPORT_KEY] = report
        return Outcome(None, headers, report)

    def _log_shadow(self, request: RequestView, error: FuseTripped) -> None:
        held = self._shadow_log.take()
        if held is not None:
            logger.warning(
                "tokenfuse shadow mode, would refuse %s %s: %s (%s)%s",
                request.method, request.path, error.reason, error,
                f"; {held} more held back" if held else "",
            )  # fmt: skip

    def _rate_headers(self, plan: Plan, decision: Decision, retry: int | None) -> Headers:
        verdict = decision.bucket
        if verdict is not None:
            capacity, rate, remaining = verdict.capacity, verdict.rate, verdict.remaining
        elif (plan.bucket or plan.fuse.bucket) is not None and retry is not None:
            # The velocity latch refused before the bucket was consulted.
            bucket = plan.bucket or plan.fuse.bucket
            assert bucket is not None
            capacity, rate, remaining = bucket.capacity, bucket.rate, 0.0
        else:
            return ()
        if retry is None:
            window = delay_seconds((capacity - remaining) / rate) if remaining < capacity else 0
        else:
            window = retry
            if decision.error is not None and decision.error.reason != "quota_exhausted":
                remaining = 0.0
        return rate_limit_headers(self.policy_name, capacity, rate, remaining, window)


def _query_of(request: RequestView) -> object:
    raw = request.raw
    return raw.get("query_string", b"") if "query_string" in raw else raw.get("QUERY_STRING", "")


def _not_recorded(total: float) -> None:
    logger.warning("tokenfuse: store unavailable, %g tokens not recorded", total)
