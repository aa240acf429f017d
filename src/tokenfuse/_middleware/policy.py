"""The protocol-free half of the middleware: what to check, and what to answer.

``Guard`` turns a request into a ``Plan`` (who, which tier, what cost) and a ``Decision`` into
an ``Outcome`` (headers for the response, or a refusal). The ASGI and WSGI shells only carry
these through their protocols and make the store call, ``aadmit`` or ``admit``.

**Headers** follow draft-ietf-httpapi-ratelimit-headers-11 (May 2026), structured-field form,
describing the caller's token bucket as a quota of ``capacity`` per the time it takes to
refill from empty::

    RateLimit-Policy: "default";q=50;w=5
    RateLimit: "default";r=12;t=4

``r`` is the whole calls left in the bucket; on allowed responses ``t`` is the seconds until
it is full again. On a refusal ``t`` equals ``Retry-After`` (the seconds until a call can
pass), so ``Retry-After`` never points before the end of the effective window (draft §6);
while a velocity latch is open, ``r=0``.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from time import monotonic
from typing import Literal

from .._core.bucket import BucketPolicy
from .._errors import ConfigurationError, FuseTripped, StoreUnavailable
from .._fuse import Decision, Fuse
from .._identity import Identity
from .defaults import default_inbound_fuse
from .identify import ANONYMOUS, Identify, bearer_or_api_key, resolve
from .request import RequestView

__all__ = [
    "Anonymous",
    "Cost",
    "Count",
    "Exclude",
    "Guard",
    "Outcome",
    "Plan",
    "Refusal",
    "Reply",
    "Tiers",
]

logger = logging.getLogger("tokenfuse.middleware")

Count = Literal["calls", "tokens"]
Anonymous = Literal["shared", "allow"]
Cost = float | Mapping[str, float] | Callable[[RequestView], float]
Tiers = Mapping[str, BucketPolicy] | Callable[[RequestView, Identity], BucketPolicy | None]
Exclude = Iterable[str] | Callable[[RequestView], bool]

_POLICY_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
_MAX_SECONDS = 1_000_000_000  # Retry-After / t cap: an absurd cost must not print 300 digits
_MAX_INTEGER = 999_999_999_999_999  # largest structured-field Integer


@dataclass(frozen=True, slots=True)
class Reply:
    """A complete response the middleware sends instead of calling the app.

    >>> Reply.json({"error": "slow down"}).status
    429
    """

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes

    @classmethod
    def json(
        cls, data: object, *, status: int = 429, headers: Iterable[tuple[str, str]] = ()
    ) -> Reply:
        body = json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()
        return cls(status, (("Content-Type", "application/json"), *headers), body)


Refusal = Callable[[FuseTripped, RequestView], Reply]


@dataclass(frozen=True, slots=True)
class Plan:
    """What one guarded request will be checked for."""

    fuse: Fuse
    identity: Identity
    bucket: BucketPolicy | None  # the caller's tier, None for the fuse's own bucket
    cost: float
    amount: float  # recorded into the velocity window at admission (0 with count="tokens")


@dataclass(frozen=True, slots=True)
class Outcome:
    """``reply`` set: refuse with it. Otherwise call the app and add ``headers``."""

    reply: Reply | None
    headers: tuple[tuple[str, str], ...]


_warned: set[str] = set()


def _name(function: object) -> str:
    return str(getattr(function, "__qualname__", None) or repr(function))


def _warn_once(what: str, exc: BaseException) -> None:
    """A broken option callable fails on every request: say so once, not per request."""
    if what not in _warned:
        _warned.add(what)
        logger.warning("tokenfuse: %s raised; using the fallback", what, exc_info=exc)


class _Throttle:
    """At most one log line per ``interval`` seconds, counting the lines it held back: a
    looping agent in shadow mode must not turn the log into a copy of the access log."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._next = 0.0
        self._held = 0

    def take(self) -> int | None:
        """None: hold this line back. Otherwise log it, with this many held back before it."""
        now = monotonic()
        if now < self._next:
            self._held += 1
            return None
        self._next = now + self.interval
        held, self._held = self._held, 0
        return held


_unavailable_log = _Throttle(1.0)  # a dead store fails every request: one line a second


def _under(path: str, prefix: str) -> bool:
    """Segment-aware prefix: ``/tools`` covers ``/tools`` and ``/tools/x``, not ``/toolsx``."""
    prefix = prefix.rstrip("/")
    return path == prefix or path.startswith(prefix + "/") or not prefix


def _seconds(value: float) -> int:
    """Delay-seconds for headers: whole seconds, rounded up, at least 1."""
    if not math.isfinite(value) or value >= _MAX_SECONDS:
        return _MAX_SECONDS
    return max(1, math.ceil(value))


def _integer(value: float) -> int:
    if not math.isfinite(value):
        return _MAX_INTEGER if value > 0 else 0
    return min(max(math.floor(value), 0), _MAX_INTEGER)


@lru_cache(maxsize=256)
def _policy(name: str, capacity: float, rate: float) -> str:
    """The ``RateLimit-Policy`` value: the same for every response of a tier."""
    return f'"{name}";q={_integer(capacity)};w={_seconds(capacity / rate)}'


def _json_number(value: object) -> object:
    if isinstance(value, float):
        return round(value, 3) if math.isfinite(value) else None
    return value


def _valid_cost(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) and number >= 0 else None


class Guard:
    """Every option of ``TokenFuse`` / ``TokenFuseWSGI``, validated once, applied per request.

    Holds configuration and caches only: nothing about any one request is kept here.
    """

    def __init__(
        self,
        *,
        fuse: Fuse | None,
        identify: Identify | None,
        anonymous: Anonymous,
        cost: Cost,
        tiers: Tiers | None,
        count: Count,
        exclude: Exclude,
        shadow: bool,
        refusal: Refusal | None,
        policy_name: str,
    ) -> None:
        self.fuse = fuse if fuse is not None else default_inbound_fuse()
        self.identify: Identify = identify if identify is not None else bearer_or_api_key
        if anonymous not in ("shared", "allow"):
            raise ConfigurationError(f"anonymous must be 'shared' or 'allow', not {anonymous!r}")
        self.anonymous = anonymous
        if count not in ("calls", "tokens"):
            raise ConfigurationError(f"count must be 'calls' or 'tokens', not {count!r}")
        if count == "tokens" and self.fuse.velocity is None:
            raise ConfigurationError("count='tokens' needs a fuse with a velocity policy")
        self.count = count
        self.shadow = bool(shadow)
        self.refusal = refusal
        if not _POLICY_NAME.match(policy_name):
            raise ConfigurationError(f"policy_name must match {_POLICY_NAME.pattern}")
        self.policy_name = policy_name
        self._cost_of = self._cost_option(cost)
        self._excluded = self._exclude_option(exclude)
        self._tier_of = self._tiers_option(tiers)
        self._shadow_log = _Throttle(1.0)

    # -- options, normalized to one callable each ---------------------------------------------

    @staticmethod
    def _cost_option(cost: Cost) -> Callable[[RequestView], float]:
        if callable(cost):
            function = cost
            name = f"cost function {_name(cost)}"

            def call(request: RequestView) -> float:
                try:
                    value = _valid_cost(function(request))
                except Exception as exc:
                    _warn_once(name, exc)
                    return 1.0
                return 1.0 if value is None else value

            return call
        if isinstance(cost, Mapping):
            routes = sorted(
                ((path, _checked_cost(value)) for path, value in cost.items()),
                key=lambda item: len(item[0]),
                reverse=True,
            )

            def by_route(request: RequestView) -> float:
                for prefix, value in routes:
                    if _under(request.path, prefix):
                        return value
                return 1.0

            return by_route
        fixed = _checked_cost(cost)
        return lambda _request: fixed

    @staticmethod
    def _exclude_option(exclude: Exclude) -> Callable[[RequestView], bool]:
        if callable(exclude):
            function = exclude
            name = f"exclude function {_name(exclude)}"

            def call(request: RequestView) -> bool:
                try:
                    return bool(function(request))
                except Exception as exc:  # guarded is the safe side of a broken predicate
                    _warn_once(name, exc)
                    return False

            return call
        if isinstance(exclude, str):
            raise ConfigurationError("exclude takes a list of paths, not one string")
        prefixes = tuple(exclude)
        if not prefixes:
            return lambda _request: False
        return lambda request: any(_under(request.path, prefix) for prefix in prefixes)

    @staticmethod
    def _tiers_option(
        tiers: Tiers | None,
    ) -> Callable[[RequestView, Identity], BucketPolicy | None] | None:
        if tiers is None:
            return None
        if callable(tiers):
            function = tiers
            name = f"tiers function {_name(tiers)}"

            def call(request: RequestView, identity: Identity) -> BucketPolicy | None:
                try:
                    found = function(request, identity)
                except Exception as exc:
                    _warn_once(name, exc)
                    return None
                return found if isinstance(found, BucketPolicy) else None

            return call
        by_key: dict[str, BucketPolicy] = {}
        for who, policy in tiers.items():
            if not isinstance(policy, BucketPolicy):
                raise ConfigurationError(f"tiers[{who!r}] must be a BucketPolicy")
            # The identity may come back as a name or as a credential: accept both forms.
            by_key[Identity.named(who).key] = policy
            by_key[Identity.secret(who).key] = policy
        return lambda _request, identity: by_key.get(identity.key)

    # -- per request -------------------------------------------------------------------------

    def plan(self, request: RequestView) -> Plan | None:
        """What to check for this request; None when it is not guarded."""
        if self._excluded(request):
            return None
        try:
            identity = resolve(self.identify(request))
        except Exception as exc:
            _warn_once(f"identify function {_name(self.identify)}", exc)
            identity = None
        if identity is None:
            if self.anonymous == "allow":
                return None
            identity = ANONYMOUS
        tier = None if self._tier_of is None else self._tier_of(request, identity)
        amount = 1.0 if self.count == "calls" else 0.0
        return Plan(self.fuse, identity, tier, self._cost_of(request), amount)

    def settle(self, plan: Plan, decision: Decision, request: RequestView) -> Outcome:
        """Headers for an allowed call, or the refusal (none of either when failing open)."""
        if decision.degraded:
            return Outcome(None, ())
        error = decision.error
        if decision.allowed or error is None:
            return Outcome(None, self._rate_headers(plan, decision, None))
        retry = _seconds(error.retry_after)
        headers = self._rate_headers(plan, decision, retry)
        if self.shadow:
            held = self._shadow_log.take()
            if held is not None:
                logger.warning(
                    "tokenfuse shadow mode, would refuse %s %s: %s (%s)%s",
                    request.method, request.path, error.reason, error,
                    f"; {held} more held back" if held else "",
                )  # fmt: skip
            return Outcome(None, headers)
        headers = (("Retry-After", str(retry)), *headers)
        if self.refusal is not None:
            reply = self.refusal(error, request)
            present = {name.lower() for name, _ in reply.headers}
            extra = tuple(item for item in headers if item[0].lower() not in present)
            return Outcome(Reply(reply.status, (*reply.headers, *extra), reply.body), ())
        body = {name: _json_number(value) for name, value in error.as_dict().items()}
        return Outcome(Reply.json(body, status=429, headers=headers), ())

    def unavailable(self, exc: StoreUnavailable) -> Reply:
        """The store is down and the fuse fails closed: 503, never a 500. The body is
        generic: the store's error names hosts and ports, which is for the log only."""
        held = _unavailable_log.take()
        if held is not None:
            more = f"; {held} more held back" if held else ""
            logger.warning("tokenfuse: failing closed with 503: %s%s", exc, more)
        message = "the rate limiter cannot decide right now; retry shortly"
        body = {"type": "store_unavailable", "message": message, "retry_after": 1}
        return Reply.json(body, status=503, headers=(("Retry-After", "1"),))

    # -- machinery -----------------------------------------------------------------------------

    def _rate_headers(
        self, plan: Plan, decision: Decision, retry: int | None
    ) -> tuple[tuple[str, str], ...]:
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
            window = _seconds((capacity - remaining) / rate) if remaining < capacity else 0
        else:
            window = retry
            if decision.error is not None and decision.error.reason != "quota_exhausted":
                remaining = 0.0
        name = self.policy_name
        return (
            ("RateLimit-Policy", _policy(name, capacity, rate)),
            ("RateLimit", f'"{name}";r={_integer(remaining)};t={window}'),
        )


def _checked_cost(value: object) -> float:
    cost = _valid_cost(value)
    if cost is None:
        raise ConfigurationError(f"cost must be a finite, non-negative number, not {value!r}")
    return cost
