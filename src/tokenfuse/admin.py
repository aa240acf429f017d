"""The operator's side of a deployment: list keys, look one up, reset it, change its limits.

::

    from tokenfuse.admin import Admin

    admin = Admin()                          # the process's fuses (TOKENFUSE_* settings)
    for view in admin.keys(sort="rate", limit=10):
        print(view.key_id, view.label, view.state, view.status.rate, view.multiple)
    admin.reset("3f9a0c1b2d4e")              # a key id, as shown next to every label
    admin.set_limit("agent-42", "50k/min")   # or a name the application chose
    admin.reset(KeyRef.secret(api_key))      # or the credential, said to be one

The ``tokenfuse`` CLI is built on it. A bare string is a key id or a name, never a credential:
one that looks like a credential, or could be two keys, is refused with what to pass instead
(``AmbiguousKey``, ``KeyNotFound``). Events come from an ``EventFeed``: this process's own
(``LocalEvents``), or one that reaches across processes, offered with ``add_feed_source``.
"""

from ._admin.feed import EventFeed, LocalEvents, add_feed_source, feed_for, local_events
from ._admin.refs import AmbiguousKey, KeyNotFound, KeyRef
from ._admin.service import Admin, NotAvailable
from ._admin.views import KeyState, KeyView

__all__ = [
    "Admin",
    "AmbiguousKey",
    "EventFeed",
    "KeyNotFound",
    "KeyRef",
    "KeyState",
    "KeyView",
    "LocalEvents",
    "NotAvailable",
    "add_feed_source",
    "feed_for",
    "local_events",
]
