"""What a fuse reports: ``FuseEvent`` values, passed to hooks and logged.

::

    from tokenfuse import Fuse
    from tokenfuse.events import FuseEvent

    def page_on_call(event: FuseEvent) -> None:
        if event.kind == "tripped":
            print(event.key, event.detail)

    fuse = Fuse(on_event=page_on_call)

Every event is also logged on ``logging.getLogger("tokenfuse")``; a hook that raises is logged
and never breaks the guarded call.
"""

from ._events import EventKind, FuseEvent, Hook

__all__ = ["EventKind", "FuseEvent", "Hook"]
