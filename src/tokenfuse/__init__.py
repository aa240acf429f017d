"""tokenfuse: stop runaway AI agents before they burn money or damage other systems.

It watches the *rate* each key spends (LLM tokens outbound, tool calls inbound) against that
key's own normal, and refuses a key whose rate looks like a loop, in under a minute.

Outbound, count the tokens of every LLM call::

    client = httpx.Client(transport=FuseTransport())

Inbound, contain the callers of your tool endpoints::

    app.add_middleware(TokenFuse)

The names here are the everyday ones. Each extension point has a module of its own:

* ``tokenfuse.fuse``: ``Fuse`` with its results ``Decision`` and ``Status``, and ``Identity``;
* ``tokenfuse.transport``: the outbound side (``FuseReport``, ``current_scope``, ...);
* ``tokenfuse.middleware``: the inbound side (identify helpers, ``RequestView``, ``Reply``, ...);
* ``tokenfuse.usage``: teach tokenfuse a provider (``UsageShape``, ``ShapeExtractor``, ...);
* ``tokenfuse.stores``: ``MemoryStore``, ``RedisStore``, ``StoreHealth``;
* ``tokenfuse.events``: ``FuseEvent``, what ``on_event`` hooks receive;
* ``tokenfuse.guards``: the guards beside the velocity check: run budgets (``run``).

docs/design.md in the repository explains how it decides.

>>> from tokenfuse import Fuse
>>> fuse = Fuse()
>>> fuse.record("agent-42", 1_200).allowed
True
"""

from __future__ import annotations

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
from ._settings import configure
from .fuse import Fuse
from .middleware import TokenFuse, TokenFuseWSGI, inbound_fuse, report_tokens
from .stores import MemoryStore
from .transport import AsyncFuseTransport, FuseTransport, scope, unwrap_refusals

if TYPE_CHECKING:
    from typing import Any

    from .stores import RedisStore

__version__ = "0.1.0"

__all__ = [
    "FREE",
    "GROWTH",
    "STARTER",
    "AsyncFuseTransport",
    "BucketPolicy",
    "CeilingExceeded",
    "ConfigurationError",
    "Fuse",
    "FuseTransport",
    "FuseTripped",
    "LoopSuspected",
    "MemoryStore",
    "QuotaExhausted",
    "RedisStore",
    "StoreUnavailable",
    "TokenFuse",
    "TokenFuseError",
    "TokenFuseWSGI",
    "VelocityPolicy",
    "__version__",
    "configure",
    "inbound_fuse",
    "report_tokens",
    "scope",
    "unwrap_refusals",
]

# Names served from a submodule on first use. RedisStore needs the optional redis package, so
# it is imported only when asked for; the others were top-level names before the extension
# points got modules of their own, and still import from here.
_ELSEWHERE = {
    "RedisStore": "stores",
    "CALL_VELOCITY": "middleware",
    "Reply": "middleware",
    "RequestView": "middleware",
    "bearer_or_api_key": "middleware",
    "by_header": "middleware",
    "default_inbound_fuse": "middleware",
    "Decision": "fuse",
    "Identity": "fuse",
    "Status": "fuse",
    "default_fuse": "fuse",
    "FuseReport": "transport",
    "FailureLoop": "transport",
    "FailureLoopPolicy": "transport",
    "forget_loops": "transport",
    "aforget_loops": "transport",
    "current_scope": "transport",
    "find_refusal": "transport",
    "FuseEvent": "events",
    "BudgetExceeded": "guards",
    "run": "guards",
    "ShapeExtractor": "usage",
    "Usage": "usage",
    "UsageShape": "usage",
    "default_registry": "usage",
}


def __getattr__(name: str) -> Any:
    """``RedisStore`` on first use, and the names that moved to a submodule."""
    from importlib import import_module

    module = _ELSEWHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'tokenfuse' has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{module}"), name)
