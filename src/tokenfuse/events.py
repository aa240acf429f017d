"""What a fuse reports: ``FuseEvent`` values, passed to hooks and logged.

::

    from tokenfuse import Fuse
    from tokenfuse.events import FuseEvent

    def page_on_call(event: FuseEvent) -> None:
        if event.kind == "tripped":
            print(event.key, event.detail)

    fuse = Fuse(on_event=page_on_call)

``listen(hook)`` calls a hook with the events of every fuse in the process (how metrics, alert
sinks and event feeds see them without code in each fuse). Every event is also logged on
``logging.getLogger("tokenfuse")``; a hook that raises is logged and never breaks the guarded
call.
"""

from ._events import EventKind, FuseEvent, Hook, listen

__all__ = ["EventKind", "FuseEvent", "Hook", "listen"]
