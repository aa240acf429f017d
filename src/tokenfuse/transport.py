"""The outbound side: count the tokens of every LLM call an httpx or httpx2 client makes.

::

    import httpx
    from tokenfuse.transport import EXTENSION, FuseTransport

    client = httpx.Client(transport=FuseTransport())
    response = client.post(url, json=body)
    report = response.extensions[EXTENSION]          # a FuseReport: identity, usage, decision

``scope("agent-42")`` counts the calls made inside a block for that name (``current_scope()``
tells which scope is active). For SDKs that wrap every transport error in their own,
``unwrap_refusals()`` re-raises the tokenfuse refusal and ``find_refusal(exc)`` finds it.
"""

# This module is the public face of _transport: the names that package exports, no more.
from ._transport import *  # noqa: F403
from ._transport import __all__ as __all__
