"""The inbound side: contain the agents that call your tool endpoints (ASGI and WSGI).

::

    from tokenfuse import RedisStore, TokenFuse
    from tokenfuse.middleware import by_header, inbound_fuse

    app.add_middleware(
        TokenFuse,
        fuse=inbound_fuse(RedisStore.from_url("redis://localhost:6379/0")),
        identify=by_header("X-Org-Id"),
    )

Building blocks: ``inbound_fuse`` / ``default_inbound_fuse`` and their velocity policy
``CALL_VELOCITY``; the identify helpers ``bearer_or_api_key`` (the default), ``by_header`` and
``verified`` (only known keys are identities of their own), which read a ``RequestView``;
``Reply``, what a custom ``refusal=`` returns; ``report_tokens``, with which a handler
reports what it spent when ``count="tokens"``; and ``LeasePolicy`` for ``lease=`` (hot
callers admitted from leases of their bucket, ``Leases`` and its ``LeaseCounts``).
"""

# This module is the public face of _middleware: the names that package exports, no more.
from ._middleware import *  # noqa: F403
from ._middleware import __all__ as __all__
