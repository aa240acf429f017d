"""Inbound: who is calling a guarded endpoint — turning a request into an ``Identity``.

Every value read here is untrusted input. It is cut to ``MAX_IDENTITY_LENGTH`` before anything
else touches it, credentials become ``Identity.secret`` (hashed for the store, redacted in
messages), and application-chosen names become ``Identity.named`` (hashed for the store too).
The middleware does not authenticate: an identity a client can invent is only as good as the
authentication in front of it (see ``by_header``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from .._identity import MAX_IDENTITY_LENGTH, Identity
from .request import RequestView

__all__ = ["ANONYMOUS", "IdentifyRequest", "bearer_or_api_key", "by_header", "resolve"]

#: The middleware's ``identify=`` option: a request in; an identity, a name, or None for
#: "nobody" out.
IdentifyRequest = Callable[[RequestView], Identity | str | None]

#: The one identity every request without an identity shares (``anonymous="shared"``).
ANONYMOUS = Identity.named("anonymous")


def _bounded(value: str | None) -> str | None:
    if value is None:
        return None
    value = value[: 4 * MAX_IDENTITY_LENGTH].strip()[:MAX_IDENTITY_LENGTH]
    return value or None


@lru_cache(maxsize=4096)
def _credential(value: str) -> Identity:
    """Hashing and redacting once per credential, not once per request (bounded: 4096 x at
    most ``MAX_IDENTITY_LENGTH`` characters)."""
    return Identity.secret(value)


def bearer_or_api_key(request: RequestView) -> Identity | None:
    """The default: ``Authorization: Bearer <token>``, else ``X-API-Key``, hashed.

    >>> from tokenfuse._middleware.request import AsgiRequest
    >>> bearer_or_api_key(AsgiRequest({"headers": [(b"x-api-key", b"k-123456789")]})).label
    'k-…6789'
    """
    authorization = request.header("authorization")
    if authorization is not None:
        scheme, _, token = authorization[: 4 * MAX_IDENTITY_LENGTH].partition(" ")
        if scheme.lower() == "bearer":
            bounded = _bounded(token)
            if bounded is not None:
                return _credential(bounded)
    key = _bounded(request.header("x-api-key"))
    return _credential(key) if key is not None else None


def by_header(name: str, *, secret: bool = False) -> Callable[[RequestView], Identity | None]:
    """Identify by one header, e.g. an org id that an authenticating proxy sets.

    Only use a header a client cannot set itself (a gateway that authenticates and overwrites
    it); otherwise every invented value is a fresh bucket. ``secret=True`` redacts the value
    in messages, for headers that carry credentials.

    >>> identify = by_header("X-Org-Id")
    """

    def identify(request: RequestView) -> Identity | None:
        value = _bounded(request.header(name))
        if value is None:
            return None
        return Identity.secret(value) if secret else Identity.named(value)

    identify.__qualname__ = f"by_header({name!r})"
    return identify


def resolve(found: Identity | str | None) -> Identity | None:
    """Normalize what an identify callable returned; strings are names, cut to length."""
    if found is None or isinstance(found, Identity):
        return found
    bounded = _bounded(str(found))
    return Identity.named(bounded) if bounded is not None else None
