"""Events a fuse reports to hooks and to ``logging.getLogger("tokenfuse")``."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from ._errors import FuseTripped

__all__ = ["EventKind", "FuseEvent", "Hook", "Hooks", "logger"]

logger = logging.getLogger("tokenfuse")

EventKind = Literal[
    "tripped",
    "near_limit",
    "reset",
    "config_changed",
    "store_unavailable",
    "store_recovered",
    "pool_exhausted",
]


@dataclass(frozen=True, slots=True)
class FuseEvent:
    """Something an operator may want to page on.

    ``key`` is the redacted label of the identity (None for store events) and ``key_id``
    its short non-secret id (``Identity.key_id``), by which an operator can address it;
    ``error`` is the refusal for ``tripped``; ``detail`` is a one-line human explanation.
    ``reset`` and ``config_changed`` report ``Fuse.reset``, ``set_limit`` and
    ``set_bucket``, so every process sharing the store sees who changed what.
    """

    kind: EventKind
    key: str | None
    detail: str
    error: FuseTripped | None = None
    at: float = field(default_factory=time.time)
    key_id: str | None = None


Hook = Callable[[FuseEvent], object]


class Hooks:
    """The listeners of one fuse. A failing hook is logged and never breaks the guarded call."""

    def __init__(self, hooks: Hook | Iterable[Hook] | None = None) -> None:
        if hooks is None:
            self._hooks: list[Hook] = []
        elif callable(hooks):
            self._hooks = [hooks]
        else:
            self._hooks = list(hooks)

    def add(self, hook: Hook) -> None:
        self._hooks.append(hook)

    def emit(self, event: FuseEvent, level: int = logging.WARNING) -> None:
        logger.log(level, "%s: %s", event.kind, event.detail)
        for hook in self._hooks:
            try:
                hook(event)
            except Exception:
                logger.exception("tokenfuse event hook %r failed", hook)
