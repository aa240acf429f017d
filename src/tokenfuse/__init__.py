"""tokenfuse: stop runaway AI agents before they burn money or damage other systems.

It watches the *rate* each key spends (LLM tokens outbound, tool calls inbound) against that
key's own normal, and refuses a key whose rate looks like a loop, in under a minute.

>>> from tokenfuse import Fuse
>>> fuse = Fuse()
>>> fuse.record("agent-42", 1_200).allowed
True
"""

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
from ._stores.memory import MemoryStore

__version__ = "0.1.0"

__all__ = [
    "FREE",
    "GROWTH",
    "STARTER",
    "BucketPolicy",
    "CeilingExceeded",
    "ConfigurationError",
    "Decision",
    "Fuse",
    "FuseEvent",
    "FuseTripped",
    "Identity",
    "LoopSuspected",
    "MemoryStore",
    "QuotaExhausted",
    "Status",
    "StoreUnavailable",
    "TokenFuseError",
    "VelocityPolicy",
    "__version__",
    "default_fuse",
]
