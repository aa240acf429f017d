"""Inbound: what ``TokenFuse`` (ASGI) and ``TokenFuseWSGI`` share — one constructor.

It takes the app, then the ``InboundOptions`` as keyword arguments; builds the one
``InboundGuard`` that checks them; and checks that the fuse's store has the face (sync or
async) that the protocol calls. A subclass adds only its protocol's ``__call__``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Generic, Literal, TypeVar

from .._errors import ConfigurationError
from .guard import InboundGuard
from .options import InboundOptions

__all__ = ["InboundMiddleware"]

App = TypeVar("App")

#: What a store lacking the face is, per face the protocol calls.
_LACKING = {"async": ("an async face", "sync-only"), "sync": ("a sync face", "async-only")}


# A dataclass, so that its generated ``__init__(self, app, *, <the options>)`` spells each option
# once, typed: Starlette's ``add_middleware(TokenFuse, **options)`` type-checks the options
# against exactly that signature (a ParamSpec over the middleware class's constructor).
@dataclass(eq=False, repr=False)
class InboundMiddleware(InboundOptions, Generic[App]):
    """An app guarded by ``InboundOptions``; the options stay readable as given."""

    app: App
    guard: InboundGuard = field(init=False)

    #: The store face this protocol calls, and what to use when the store lacks it.
    face: ClassVar[Literal["sync", "async"]]
    otherwise: ClassVar[str]

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mcp and self.face != "async":
            raise ConfigurationError("mcp=True is for ASGI apps (MCP servers are): use TokenFuse")
        self.guard = InboundGuard(self)
        fuse = self.guard.fuse
        if not (fuse.has_async if self.face == "async" else fuse.has_sync):
            needed, lacking = _LACKING[self.face]
            raise ConfigurationError(
                f"{type(self).__name__} needs a store with {needed}; {fuse.store!r} is "
                f"{lacking} (use RedisStore.from_url, or {self.otherwise})"
            )
