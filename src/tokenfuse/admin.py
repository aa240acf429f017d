"""The operator's side of a deployment: list keys, look one up, reset it, change its limits,
from Python, or from a browser with the admin app.

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
(``AmbiguousKey``, ``KeyNotFound``). Events come from an ``EventFeed``: the store's own log when
it keeps one (a Redis Stream every process shares), else this process's (``LocalEvents``); a
feed of another kind plugs in with ``add_feed_source``.

The admin app (the ``admin`` extra: Starlette) is a JSON API and a live dashboard of one fuse's
keys, to mount in your own app or to ``serve``::

    asgi = tokenfuse.admin.app(fuse, token=os.environ["TOKENFUSE_ADMIN_TOKEN"])
    routes = [Mount("/admin", asgi)]
    tokenfuse.admin.serve(fuse, port=8787, token=os.environ["TOKENFUSE_ADMIN_TOKEN"])

docs/admin.md describes its endpoints, its auth and the event stream.
"""

from ._admin.feed import EventFeed, LocalEvents, add_feed_source, feed_for, local_events
from ._admin.refs import AmbiguousKey, KeyNotFound, KeyRef
from ._admin.service import Admin, NotAvailable
from ._admin.views import KeyState, KeyView
from ._dashboard import app, serve

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
    "app",
    "feed_for",
    "local_events",
    "serve",
]
