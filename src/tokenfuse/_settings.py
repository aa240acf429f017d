"""Configuration without code: the settings behind every zero-argument guard in a process.

``FuseTransport()`` and ``app.add_middleware(TokenFuse)`` take their fuse from here: a store
(``TOKENFUSE_REDIS_URL``, else the embedded one) and the policies' main numbers, read from the
environment at first use, or set in code with ``tokenfuse.configure(...)``. So every process of
a deployment shares one Redis and one policy without a line of code changing, and the CLI and
the admin app see the same keys the guards write. Each variable is described in
``docs/configuration.md``; ``VARIABLES`` below is the one list of them.

>>> settings = Settings.from_env({"TOKENFUSE_LIMIT": "50k/min", "TOKENFUSE_BUCKET_RATE": "20/s"})
>>> settings.velocity().limit, settings.bucket().rate
(50000.0, 20.0)
"""

from __future__ import annotations

import math
import os
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from ._core.bucket import FREE, BucketPolicy
from ._core.rates import per_minute, per_second
from ._core.velocity import VelocityPolicy
from ._errors import ConfigurationError

if TYPE_CHECKING:
    from ._fuse import Fuse
    from ._stores.base import AsyncStore, SyncStore

__all__ = [
    "VARIABLES",
    "Settings",
    "Variable",
    "configure",
    "current",
    "default_fuses",
    "duration",
    "reload",
]

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|min|h|d)?\s*$", re.IGNORECASE)
_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3_600.0, "d": 86_400.0}


def _flag(text: str, name: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigurationError(f"{name} must be one of 1/0, true/false, yes/no, on/off; not {text!r}")


def duration(value: float | str, name: str) -> float:
    """Seconds from a number or a string such as ``"90s"``, ``"15m"``, ``"3d"``, ``"250ms"``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if match is None:
            raise ConfigurationError(
                f"{name}: write a duration such as 90s, 15m, 1h or 3d, not {value!r}"
            )
        seconds = float(match[1]) * _SECONDS[(match[2] or "s").lower()]
    if not math.isfinite(seconds) or seconds < 0:
        raise ConfigurationError(f"{name} must be a finite, non-negative duration, not {value!r}")
    return seconds


def _number_or_text(value: float | str) -> float | str:
    """A plain number written as text (``"20000"``) is that number; other text is a rate."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _per_minute(value: float | str, name: str) -> float:
    return per_minute(_number_or_text(value), name)


def _per_second(value: float | str, name: str) -> float:
    return per_second(_number_or_text(value), name)


def _optional_limit(value: float | str | None, name: str) -> float | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "off")):
        return None
    return _per_minute(value, name)


def _positive(value: float | str, name: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigurationError(f"{name} must be a number, not {value!r}") from None
    if not (math.isfinite(number) and number > 0):
        raise ConfigurationError(f"{name} must be a positive number, not {value!r}")
    return number


def _count(value: int | str, name: str) -> int:
    number = _positive(value, name)
    if number != int(number):
        raise ConfigurationError(f"{name} must be a whole number, not {value!r}")
    return int(number)


def _url(value: str, name: str) -> str | None:
    url = str(value).strip()
    if url and not url.startswith(("http://", "https://")):
        raise ConfigurationError(f"{name} must be an http:// or https:// URL")
    return url or None


def _keys(value: str | tuple[str, ...] | list[str], name: str) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else list(value)
    return tuple(item.strip() for item in items if item.strip())


@dataclass(frozen=True, slots=True)
class Variable:
    """One environment variable: the setting it fills and how its text is read."""

    env: str
    setting: str
    read: Callable[[Any, str], Any]
    help: str


#: Every variable tokenfuse reads, in the order ``docs/configuration.md`` lists them.
VARIABLES: tuple[Variable, ...] = (
    Variable(
        "TOKENFUSE_REDIS_URL",
        "redis_url",
        lambda v, n: str(v).strip() or None,
        "Redis shared by every process (redis://, rediss://, redis+cluster://); unset: the "
        "embedded in-process store.",
    ),
    Variable(
        "TOKENFUSE_REDIS_PREFIX",
        "redis_prefix",
        lambda v, n: str(v).strip(),
        "First part of every Redis key tokenfuse writes (default tokenfuse).",
    ),
    Variable(
        "TOKENFUSE_SECRET",
        "secret",
        lambda v, n: str(v) or None,
        "Deployment secret for the keyed identity hash; every process sharing a Redis must "
        "share it.",
    ),
    Variable(
        "TOKENFUSE_FAIL_CLOSED",
        "fail_closed",
        _flag,
        "1: refuse calls while the store is unreachable (default 0: fail open).",
    ),
    Variable(
        "TOKENFUSE_SHADOW",
        "shadow",
        _flag,
        "1: every transport and middleware decides and reports but never refuses.",
    ),
    Variable(
        "TOKENFUSE_LIMIT",
        "limit",
        _optional_limit,
        "Outbound manual ceiling in tokens per minute per key (50k/min, 1M/hour); default none.",
    ),
    Variable(
        "TOKENFUSE_COLD_START_LIMIT",
        "cold_start_limit",
        _optional_limit,
        "Outbound ceiling while a key's baseline is not established (default 100k/min; "
        "off disables it).",
    ),
    Variable(
        "TOKENFUSE_SPIKE_MULTIPLE",
        "spike_multiple",
        _positive,
        "Rate over the established baseline that is a loop (default 10).",
    ),
    Variable(
        "TOKENFUSE_MIN_BASELINE",
        "min_baseline",
        _per_minute,
        "Baselines below this are not spike-checked (default 100/min).",
    ),
    Variable(
        "TOKENFUSE_LEARNING_PERIOD",
        "learning_period",
        duration,
        "Time since first seen before a baseline counts (default 3d).",
    ),
    Variable(
        "TOKENFUSE_COOLDOWN",
        "cooldown",
        duration,
        "How long a trip blocks a key before doubling on repeats (default 60s).",
    ),
    Variable(
        "TOKENFUSE_INBOUND_LIMIT",
        "inbound_limit",
        _optional_limit,
        "Inbound manual ceiling in calls per minute per caller; default none.",
    ),
    Variable(
        "TOKENFUSE_BUCKET_RATE",
        "bucket_rate",
        _per_second,
        "Inbound bucket refill per caller (numbers per second, or 600/min); default 10/s.",
    ),
    Variable(
        "TOKENFUSE_BUCKET_CAPACITY",
        "bucket_capacity",
        _positive,
        "Inbound bucket capacity: the burst an idle caller may spend (default 50).",
    ),
    Variable(
        "TOKENFUSE_ALERT_WEBHOOK",
        "alert_webhook",
        _url,
        "URL that receives a JSON POST for every trip and near-limit episode.",
    ),
    Variable(
        "TOKENFUSE_METRICS",
        "metrics",
        _flag,
        "0: do not publish metrics even when prometheus_client or opentelemetry-api is "
        "installed (default 1).",
    ),
    Variable(
        "TOKENFUSE_METRICS_KEYS",
        "metrics_keys",
        _keys,
        "Comma-separated key ids or names that always get per-key metric series.",
    ),
    Variable(
        "TOKENFUSE_METRICS_TOP",
        "metrics_top",
        lambda v, n: 0 if str(v).strip() == "0" else _count(v, n),
        "How many of the busiest keys get per-key metric series (default 10; 0: none).",
    ),
    Variable(
        "TOKENFUSE_ADMIN_TOKEN",
        "admin_token",
        lambda v, n: str(v).strip() or None,
        "Bearer token of the admin app (tokenfuse dashboard); unset: it serves loopback only.",
    ),
)

_BY_SETTING = {variable.setting: variable for variable in VARIABLES}


_VELOCITY = VelocityPolicy()


# repr=False: the generated repr would show the secret and the URLs' passwords.
@dataclass(frozen=True, slots=True, repr=False)
class Settings:
    """The process's configuration: a store and the main numbers of the default policies.

    The defaults are the policies' own (``VelocityPolicy()``, the ``FREE`` bucket);
    ``limit`` and ``inbound_limit`` None mean no manual ceiling.
    """

    redis_url: str | None = None
    redis_prefix: str = "tokenfuse"
    secret: str | None = None
    fail_closed: bool = False
    shadow: bool = False
    limit: float | None = None
    cold_start_limit: float | None = _VELOCITY.cold_start_limit
    spike_multiple: float = _VELOCITY.spike_multiple
    min_baseline: float = _VELOCITY.min_baseline
    learning_period: float = _VELOCITY.learning_period
    cooldown: float = _VELOCITY.cooldown
    inbound_limit: float | None = None
    bucket_rate: float = FREE.rate
    bucket_capacity: float = FREE.capacity
    alert_webhook: str | None = None
    metrics: bool = True
    metrics_keys: tuple[str, ...] = ()
    metrics_top: int = 10
    admin_token: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """The settings the ``TOKENFUSE_*`` variables of ``environ`` (default: this process's
        environment) describe; a variable that is not set leaves its default."""
        environ = os.environ if environ is None else environ
        given = {
            variable.setting: variable.read(environ[variable.env], variable.env)
            for variable in VARIABLES
            if variable.env in environ
        }
        return cls(**given)

    def updated(self, **changes: Any) -> Settings:
        """These settings with ``changes`` (keyword names as the fields), each checked as the
        environment's text would be."""
        unknown = set(changes) - set(_BY_SETTING)
        if unknown:
            known = ", ".join(sorted(_BY_SETTING))
            raise ConfigurationError(f"unknown setting(s) {sorted(unknown)}; known: {known}")
        read: dict[str, Any] = {name: _read(name, value) for name, value in changes.items()}
        return replace(self, **read)

    # -- what the settings build ---------------------------------------------------------------

    def velocity(self) -> VelocityPolicy:
        """The outbound (tokens) policy: ``VelocityPolicy`` with the numbers set here."""
        return VelocityPolicy(
            limit=self.limit,
            cold_start_limit=self.cold_start_limit,
            spike_multiple=self.spike_multiple,
            min_baseline=self.min_baseline,
            learning_period=self.learning_period,
            cooldown=self.cooldown,
        )

    def inbound_velocity(self) -> VelocityPolicy:
        """The inbound (calls) policy: ``CALL_VELOCITY`` with ``inbound_limit`` as its ceiling."""
        from ._middleware.defaults import CALL_VELOCITY

        if self.inbound_limit is None:
            return CALL_VELOCITY
        return replace(CALL_VELOCITY, limit=self.inbound_limit)

    def bucket(self) -> BucketPolicy:
        """The inbound bucket: ``FREE`` with the rate and capacity set here."""
        return BucketPolicy(rate=self.bucket_rate, capacity=self.bucket_capacity)

    def store(self) -> SyncStore | AsyncStore:
        """A new store: ``RedisStore.from_url(redis_url)``, or ``MemoryStore()`` without one."""
        if self.redis_url is None:
            from ._stores.memory import MemoryStore

            return MemoryStore()
        from ._stores.redis import RedisStore

        return RedisStore.from_url(self.redis_url, prefix=self.redis_prefix)

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={value!r}" for name, value in self.describe().items())
        return f"Settings({shown})"

    def describe(self) -> dict[str, object]:
        """Every setting with its value, credentials and URLs' passwords hidden (for the CLI)."""
        shown: dict[str, object] = {}
        for item in fields(self):
            value = getattr(self, item.name)
            if item.name in ("secret", "admin_token") and value is not None:
                value = "(set)"
            elif item.name in ("redis_url", "alert_webhook") and value is not None:
                value = _without_password(value)
            shown[item.name] = value
        return shown


_NULLABLE = {
    "redis_url", "secret", "limit", "cold_start_limit", "inbound_limit", "alert_webhook",
    "admin_token",
}  # fmt: skip


def _read(name: str, value: Any) -> Any:
    """A value given in code, checked as its variable's text would be."""
    read = _BY_SETTING[name].read
    if value is None:
        if name not in _NULLABLE:
            raise ConfigurationError(f"{name} cannot be None")
        return None
    if isinstance(value, bool):
        if read is not _flag:
            raise ConfigurationError(f"{name} must not be a bool")
        return value
    return read(value, name)


def _without_password(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    if not sep or not at:
        return url
    user = credentials.partition(":")[0]
    return f"{scheme}://{user}:***@{host}" if user else f"{scheme}://***@{host}"


# -- the process's settings and the default fuses built from them ----------------------------


@dataclass(slots=True)
class _Defaults:
    settings: Settings
    outbound: Fuse | None = None
    inbound: Fuse | None = None
    store: SyncStore | AsyncStore | None = None


_lock = threading.RLock()  # reentrant: building the default fuses reads the settings
_state: _Defaults | None = None


def _defaults() -> _Defaults:
    global _state
    if _state is None:
        _state = _Defaults(Settings.from_env())
    return _state


def current() -> Settings:
    """The settings of this process: the environment's, then whatever ``configure`` set."""
    with _lock:
        return _defaults().settings


def configure(**settings: Any) -> Settings:
    """Set this process's configuration in code, over the ``TOKENFUSE_*`` environment.

    Takes the settings' names in lower case (``redis_url``, ``limit``, ``bucket_rate``, ...;
    ``docs/configuration.md`` lists them) and returns the settings now in force. Guards built
    afterwards without a fuse use them: the default fuses are built anew, on first use.
    Guards built before keep the fuse they already hold, so call this at start-up.

    >>> import tokenfuse
    >>> tokenfuse.configure(limit="50k/min").limit          # doctest: +SKIP
    50000.0
    """
    global _state
    with _lock:
        updated = _defaults().settings.updated(**settings)
        _state = _Defaults(updated)
    _observers_follow(updated)
    return updated


def reload(environ: Mapping[str, str] | None = None) -> Settings:
    """Forget what ``configure`` set and the default fuses: read the environment (or
    ``environ``) again, as a new process would. Mostly for tests."""
    global _state
    with _lock:
        _state = _Defaults(Settings.from_env(environ))
    _observers_follow(_state.settings)
    return _state.settings


def _observers_follow(settings: Settings) -> None:
    from ._observe import apply  # it imports this module

    apply(settings)


def default_fuses() -> tuple[Fuse, Fuse]:
    """The process-wide (outbound, inbound) fuses, built from the settings on first use.

    Both share one store: the embedded one, or the ``RedisStore`` of ``redis_url``.
    """
    from ._fuse import Fuse

    with _lock:
        state = _defaults()
        if state.outbound is None or state.inbound is None:
            settings = state.settings
            store = state.store = state.store or settings.store()
            closed, secret = settings.fail_closed, settings.secret
            state.outbound = Fuse(
                store, velocity=settings.velocity(), fail_closed=closed, secret=secret
            )
            state.inbound = Fuse(
                store,
                name="inbound",
                velocity=settings.inbound_velocity(),
                bucket=settings.bucket(),
                fail_closed=closed,
                secret=secret,
            )
        return state.outbound, state.inbound
