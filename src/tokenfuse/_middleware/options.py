"""Inbound: the middleware's options — declared, documented and checked in this one place.

``InboundOptions`` lists them; ``TokenFuse`` and ``TokenFuseWSGI`` take them as keyword
arguments after the app (``shell.py``). The ``*_rule`` functions turn each option that may be
a callable, a mapping or a constant (``identify``, ``cost``, ``exclude``, ``tiers``) into one
callable, refusing bad values at construction time. After that, a bad request, a broken user
callable or a bad value it returns costs a fallback and one log line (once per option of one
middleware), never an exception in the request.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, ParamSpec, TypeVar

from .._core.bucket import BucketPolicy
from .._core.lease import LeasePolicy
from .._errors import ConfigurationError, FuseTripped
from .._fuse import Fuse
from .._identity import Identity
from .._loops import FailureLoopPolicy
from .identify import IdentifyRequest, resolve
from .mcp.mode import McpMode
from .reply import Reply
from .report import TOKENS_HEADER
from .request import RequestView

__all__ = [
    "Anonymous",
    "Cost",
    "Count",
    "Exclude",
    "InboundOptions",
    "Refusal",
    "Tiers",
    "cost_rule",
    "exclude_rule",
    "identify_rule",
    "tiers_rule",
]

logger = logging.getLogger("tokenfuse.middleware")

Count = Literal["calls", "tokens"]
Anonymous = Literal["shared", "client", "allow"]
Cost = float | Mapping[str, float] | Callable[[RequestView], float]
Tiers = Mapping[str, BucketPolicy] | Callable[[RequestView, Identity], BucketPolicy | None]
Exclude = Iterable[str] | Callable[[RequestView], bool]
Refusal = Callable[[FuseTripped, RequestView], Reply]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

#: The failure-loop breaker's policy unless told otherwise: on, with its defaults.
DEFAULT_FAILURE_LOOPS = FailureLoopPolicy()

_POLICY_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


# repr=False: ``tiers`` may be keyed by raw credentials, which must never be rendered.
@dataclass(kw_only=True, eq=False, repr=False)
class InboundOptions:
    """The options of ``TokenFuse`` and ``TokenFuseWSGI`` (the same for both protocols).

    >>> InboundOptions(cost={"/tools/refund": 5}, exclude=["/health"]).count
    'calls'

    Args:
        fuse: the ``Fuse`` to decide with (``inbound_fuse(...)``); by default the process-wide
            ``default_inbound_fuse()``: ``FREE`` bucket and ``CALL_VELOCITY`` on the
            embedded store.
        identify: ``request -> Identity | str | None``; default ``bearer_or_api_key``, which
            does not verify keys: ``verified(is_valid)`` does.
        anonymous: requests without an identity share one ``anonymous`` identity
            (``"shared"``, the default), are counted per client address (``"client"``, see
            ``trusted_proxies``), or pass unguarded (``"allow"``).
        trusted_proxies: addresses or CIDR networks of your reverse proxies: only a peer in
            them is believed about the client address (``X-Forwarded-For``).
        cost: bucket cost per call: a number, ``{path prefix: cost}`` (longest prefix wins,
            others cost 1), or ``request -> cost`` (an error or invalid value costs 1 and is
            logged once).
        tiers: bucket policy per identity: ``{name or credential: BucketPolicy}`` or
            ``(request, identity) -> BucketPolicy | None``. Live overrides
            (``Fuse.set_bucket``) win over both.
        count: what the velocity check counts: ``"calls"``, or ``"tokens"`` the handler
            reports (``TokenFuse-Tokens`` response header or ``report_tokens``).
        exclude: path prefixes (``["/health"]``) or ``request -> bool``: not guarded at all.
        shadow: decide, log and send the headers, but never refuse.
        refusal: ``(error, request) -> Reply`` to shape refusals; ``Retry-After`` and the
            ``RateLimit`` headers are added unless the reply sets them.
        policy_name: the policy's name in the ``RateLimit`` headers.
        tokens_header: the response header a handler may report tokens in (stripped).
        mcp: ``True`` (or an ``McpMode``) in front of an MCP server (ASGI only): charge
            ``tools/call`` by tool name (``cost={"refund": 5}``), never the protocol's own
            messages, and refuse in MCP's shape (``docs/mcp.md``).
        lease: ``True`` (or a ``LeasePolicy``) to admit a caller's calls from a slice of its
            bucket this process leases from the store, one round trip per lease instead of
            per call; for callers above ~500 calls/s on a shared store. The bucket may then
            admit up to ``processes * LeasePolicy.largest`` more in any interval
            (``docs/design.md#leases``). Off by default.
        failure_loops: the failure-loop breaker (``FailureLoopPolicy``): the same caller
            calling the same route with the same arguments and getting an error (status 400
            or more, 429 excepted) ``failures`` times within ``window`` gets a 429 naming the
            call and the count (``docs/guards.md#failure-loop-breaker``). ``None`` turns it
            off. MCP mode has its own (``docs/mcp.md``).
    """

    fuse: Fuse | None = None
    identify: IdentifyRequest | None = None
    anonymous: Anonymous = "shared"
    trusted_proxies: Iterable[str] = ()
    cost: Cost = 1.0
    tiers: Tiers | None = None
    count: Count = "calls"
    exclude: Exclude = ()
    shadow: bool = False
    refusal: Refusal | None = None
    policy_name: str = "default"
    tokens_header: str = TOKENS_HEADER
    mcp: bool | McpMode = False
    lease: bool | LeasePolicy = False
    failure_loops: FailureLoopPolicy | None = DEFAULT_FAILURE_LOOPS

    def __post_init__(self) -> None:
        McpMode.of(self.mcp)  # refuses anything but a bool or an McpMode
        if not isinstance(self.lease, (bool, LeasePolicy)):
            raise ConfigurationError(f"lease must be a bool or a LeasePolicy, not {self.lease!r}")
        if self.failure_loops is not None and not isinstance(self.failure_loops, FailureLoopPolicy):
            raise ConfigurationError(
                "failure_loops must be a FailureLoopPolicy or None, not "
                f"{type(self.failure_loops).__name__}"
            )
        if self.anonymous not in ("shared", "client", "allow"):
            raise ConfigurationError(
                f"anonymous must be 'shared', 'client' or 'allow', not {self.anonymous!r}"
            )
        if self.count not in ("calls", "tokens"):
            raise ConfigurationError(f"count must be 'calls' or 'tokens', not {self.count!r}")
        if not _POLICY_NAME.match(self.policy_name):
            raise ConfigurationError(f"policy_name must match {_POLICY_NAME.pattern}")


# -- the options that take several forms, normalized to one callable each ----------------------


def _name(function: object) -> str:
    return str(getattr(function, "__qualname__", None) or repr(function))


class _Rejected(Exception):
    """A value an option function returned that its check refuses, e.g. a cost of NaN."""

    def __init__(self, value: object, expected: str) -> None:
        super().__init__(f"returned {value!r:.40}, not {expected}")


def _guarded(
    function: Callable[P, R], what: str, check: Callable[[R], T], fallback: T
) -> Callable[P, T]:
    """``function`` for per-request use: its result passed through ``check``. An exception,
    or a value ``check`` rejects, is answered with ``fallback`` and logged, each kind once: a
    broken option fails on every request, and one line says so as well as a thousand."""
    name = f"{what} function {_name(function)}"
    said: set[str] = set()

    def once(kind: str, problem: object, exc: Exception | None = None) -> None:
        # Per kind, not per value: a caller varying a bad header must not flood the log.
        if kind not in said:
            said.add(kind)
            logger.warning("tokenfuse: %s %s; using %r (logged once)", name, problem, fallback,
                           exc_info=exc)  # fmt: skip

    def call(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return check(function(*args, **kwargs))
        except _Rejected as rejected:
            once("rejected", rejected)
        except Exception as exc:
            once("raised", "raised", exc)
        return fallback

    return call


def _under(path: str, prefix: str) -> bool:
    """Segment-aware prefix: ``/tools`` covers ``/tools`` and ``/tools/x``, not ``/toolsx``."""
    prefix = prefix.rstrip("/")
    return path == prefix or path.startswith(prefix + "/") or not prefix


def _valid_cost(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) and number >= 0 else None


def _per_request_cost(value: object) -> float:
    cost = _valid_cost(value)
    if cost is None:
        raise _Rejected(value, "a finite, non-negative number")
    return cost


def _checked_cost(value: object) -> float:
    cost = _valid_cost(value)
    if cost is None:
        raise ConfigurationError(f"cost must be a finite, non-negative number, not {value!r}")
    return cost


def identify_rule(identify: IdentifyRequest) -> Callable[[RequestView], Identity | None]:
    """The ``identify`` option as ``request -> Identity | None``; an error is None ("nobody")."""
    return _guarded(identify, "identify", resolve, None)


def cost_rule(cost: Cost) -> Callable[[RequestView], float]:
    """The ``cost`` option as ``request -> cost``; an error or invalid value (NaN, infinite,
    negative, not a number) costs 1 and is logged once."""
    if callable(cost):
        return _guarded(cost, "cost", _per_request_cost, 1.0)
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


def exclude_rule(exclude: Exclude) -> Callable[[RequestView], bool] | None:
    """The ``exclude`` option as ``request -> bool``, or None when it excludes nothing (the
    default: no call to make per request); a broken predicate guards the request (guarded
    is the safe side)."""
    if callable(exclude):
        return _guarded(exclude, "exclude", bool, False)
    if isinstance(exclude, str):
        raise ConfigurationError("exclude takes a list of paths, not one string")
    prefixes = tuple(exclude)
    if not prefixes:
        return None
    return lambda request: any(_under(request.path, prefix) for prefix in prefixes)


def _policy_or_none(value: object) -> BucketPolicy | None:
    if value is None or isinstance(value, BucketPolicy):
        return value
    raise _Rejected(value, "a BucketPolicy or None")


def tiers_rule(
    tiers: Tiers | None,
) -> Callable[[RequestView, Identity], BucketPolicy | None] | None:
    """The ``tiers`` option as ``(request, identity) -> BucketPolicy | None`` (None: the
    fuse's own bucket), or None when there are no tiers (no call to make per request); an
    error or a value that is not a ``BucketPolicy`` is None."""
    if tiers is None:
        return None
    if callable(tiers):
        return _guarded(tiers, "tiers", _policy_or_none, None)
    by_identity: dict[Identity, BucketPolicy] = {}
    for who, policy in tiers.items():
        if not isinstance(policy, BucketPolicy):
            raise ConfigurationError(f"tiers[{who!r}] must be a BucketPolicy")
        # The identity may come back as a name or as a credential: accept both forms.
        by_identity[Identity.named(who)] = policy
        by_identity[Identity.secret(who)] = policy
    return lambda _request, identity: by_identity.get(identity)
