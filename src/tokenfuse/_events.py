"""Events a fuse reports to hooks and to ``logging.getLogger("tokenfuse")``."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from ._errors import FuseTripped

__all__ = ["EventKind", "FuseEvent", "Hook", "Hooks", "listen", "logger"]

logger = logging.getLogger("tokenfuse")

EventKind = Literal[
    "tripped",
    "near_limit",
    "store_unavailable",
    "store_recovered",
    "pool_exhausted",  # no pooled connection came free in time: back-pressure, not an outage
    "usage_estimated",
    "usage_unknown",
    "usage_partial",
    "forgiven",  # an operator taught the fuse that a trip was legitimate (Fuse.forgive)
    "reset",  # a key was closed and refilled by hand (``Fuse.reset``, tokenfuse.admin)
    "configured",  # a key's live limit or bucket was changed (``set_limit``, ``set_bucket``)
    "failure_loop",  # the same call failed often enough to be refused (``FailureLoop``)
    "repeat_loop",  # the same call was sent again and again (reported, or refused if so set)
    "budget_near",  # a run's spending reached 80 % of a limit (``tokenfuse.run``), once a run
    "budget_exceeded",  # a run refused a call, or a call's bill took it over, once a run
    "price_unknown",  # a model with no price: its calls count in tokens only (once a model)
]


@dataclass(frozen=True, slots=True)
class FuseEvent:
    """Something an operator may want to see or page on.

    ``key`` is the redacted label of the identity and ``key_id`` its short, non-secret id, by
    which an operator addresses it (``tokenfuse reset <key_id>``); both None for store events.
    ``fuse`` is the name of the fuse it is about, when the reporter says. ``error`` is the
    refusal for ``tripped``; ``detail`` is a one-line human explanation, naming the key by label
    and id.
    """

    kind: EventKind
    key: str | None
    detail: str
    error: FuseTripped | None = None
    at: float = field(default_factory=time.time)
    key_id: str | None = None
    fuse: str | None = None


Hook = Callable[[FuseEvent], object]

# Hooks of the whole process (``listen``): a tuple replaced on change, so emitting reads it
# without a lock.
_everywhere: tuple[Hook, ...] = ()
_everywhere_lock = threading.Lock()


def listen(hook: Hook) -> Callable[[], None]:
    """Call ``hook`` with every event of every fuse in this process, after each fuse's own
    hooks; returns a function that stops it. Metrics, alert sinks and event feeds use this.

    >>> stop = listen(print)
    >>> stop()
    """
    global _everywhere
    with _everywhere_lock:
        _everywhere = (*_everywhere, hook)

    def stop() -> None:
        global _everywhere
        with _everywhere_lock:
            _everywhere = tuple(h for h in _everywhere if h is not hook)

    return stop


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
        for hook in (*self._hooks, *_everywhere):
            try:
                hook(event)
            except Exception:
                logger.exception("tokenfuse event hook %r failed", hook)
