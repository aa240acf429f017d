"""tokenfuse: stop runaway AI agents before they burn money or damage other systems.

It watches the *rate* each key spends (LLM tokens outbound, tool calls inbound) against that
key's own normal, and refuses a key whose rate looks like a loop, in under a minute.

>>> from tokenfuse import Fuse
>>> fuse = Fuse()
>>> fuse.record("agent-42", 1_200).allowed
True
"""

from typing import TYPE_CHECKING

from ._core.bucket import FREE, GROWTH, STARTER, BucketPolicy
from ._core.velocity import VelocityPolicy
from ._errors import (
    CeilingExceeded,
    ConfigurationError,
    FuseTripped,
    LoopSuspected,
    QuotaExhausted,
    StoreUnavailable,
    TokenFuseError,
)
from ._events import FuseEvent
from ._fuse import Decision, Fuse, Status, default_fuse
from ._identity import Identity
from ._middleware import (
    CALL_VELOCITY,
    Reply,
    RequestView,
    TokenFuse,
    TokenFuseWSGI,
    bearer_or_api_key,
    by_header,
    default_inbound_fuse,
    inbound_fuse,
    report_tokens,
)
from ._settings import configure
from ._stores.memory import MemoryStore
from ._transport import (
    AsyncFuseTransport,
    FuseReport,
    FuseTransport,
    current_scope,
    find_refusal,
    scope,
    unwrap_refusals,
)
from ._usage import ShapeExtractor, Usage, UsageShape, default_registry

if TYPE_CHECKING:
    from ._stores.redis import RedisStore


def __getattr__(name: str) -> object:
    # RedisStore needs the optional ``redis`` package: import it only when asked for.
    if name == "RedisStore":
        from ._stores.redis import RedisStore

        return RedisStore
    raise AttributeError(f"module 'tokenfuse' has no attribute {name!r}")


__version__ = "0.1.0"

__all__ = [
    "CALL_VELOCITY",
    "FREE",
    "GROWTH",
    "STARTER",
    "AsyncFuseTransport",
    "BucketPolicy",
    "CeilingExceeded",
    "ConfigurationError",
    "Decision",
    "Fuse",
    "FuseEvent",
    "FuseReport",
    "FuseTransport",
    "FuseTripped",
    "Identity",
    "LoopSuspected",
    "MemoryStore",
    "QuotaExhausted",
    "RedisStore",
    "Reply",
    "RequestView",
    "ShapeExtractor",
    "Status",
    "StoreUnavailable",
    "TokenFuse",
    "TokenFuseError",
    "TokenFuseWSGI",
    "Usage",
    "UsageShape",
    "VelocityPolicy",
    "__version__",
    "bearer_or_api_key",
    "by_header",
    "configure",
    "current_scope",
    "default_fuse",
    "default_inbound_fuse",
    "default_registry",
    "find_refusal",
    "inbound_fuse",
    "report_tokens",
    "scope",
    "unwrap_refusals",
]
