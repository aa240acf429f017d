"""Inbound: who is calling a guarded endpoint — turning a request into an ``Identity``.

Every value read here is untrusted input. Credentials become ``Identity.secret`` (hashed whole,
shown only redacted), application-chosen names ``Identity.named``. The middleware does not
authenticate: with the default ``bearer_or_api_key``, a caller that invents a new API key for
every request gets a fresh bucket for each. ``verified(is_valid)`` closes that hole: only a key
``is_valid`` accepts is an identity of its own; any other request is nobody, and nobody is
counted per client address with ``anonymous="client"`` (or in one shared bucket by default).
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from .._errors import ConfigurationError
from .._identity import Identity
from .request import RequestView

__all__ = [
    "ANONYMOUS",
    "IdentifyRequest",
    "bearer_or_api_key",
    "by_header",
    "credential",
    "resolve",
    "verified",
]

#: The middleware's ``identify=`` option: a request in; an identity, a name, or None for
#: "nobody" out.
IdentifyRequest = Callable[[RequestView], Identity | str | None]

#: The one identity every request without an identity shares (``anonymous="shared"``).
ANONYMOUS = Identity.named("anonymous")


def _present(value: str | None) -> str | None:
    """The value without surrounding blanks; None when nothing is left. Never cut: the whole
    value is the identity (two tokens with a common prefix are two callers)."""
    if value is None:
        return None
    return value.strip() or None


def credential(request: RequestView) -> str | None:
    """The raw credential of a request: ``Authorization: Bearer <token>``, else ``X-API-Key``.

    >>> from tokenfuse._middleware.request import AsgiRequest
    >>> credential(AsgiRequest({"headers": [(b"authorization", b"Bearer k-1")]}))
    'k-1'
    """
    authorization = request.header("authorization")
    if authorization is not None:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() == "bearer" and (found := _present(token)) is not None:
            return found
    return _present(request.header("x-api-key"))


def bearer_or_api_key(request: RequestView) -> Identity | None:
    """The default: the request's ``credential``, hashed. Not verified: see ``verified``.

    >>> from tokenfuse._middleware.request import AsgiRequest
    >>> bearer_or_api_key(AsgiRequest({"headers": [(b"x-api-key", b"k-0123456789abcdef")]})).label
    'k-…cdef'
    """
    found = credential(request)
    return Identity.secret(found) if found is not None else None


def verified(
    is_valid: Callable[[str], bool] | Collection[str],
    *,
    read: Callable[[RequestView], str | None] = credential,
) -> Callable[[RequestView], Identity | None]:
    """Identify by a credential only once ``is_valid`` accepts it; otherwise nobody.

    ``is_valid`` is a predicate over the raw credential (a database lookup: cache it, it runs
    on every request) or the collection of valid keys. Pair it with ``anonymous="client"`` so
    that callers with invented keys share one bucket per client address::

        app.add_middleware(
            TokenFuse,
            identify=verified(API_KEYS),      # or verified(lambda key: keys.lookup(key))
            anonymous="client",
            trusted_proxies=["10.0.0.0/8"],   # where X-Forwarded-For may be believed
        )

    ``read`` picks the credential out of the request (default: ``credential``). A predicate
    that raises counts the request as nobody, logged once.
    """
    if callable(is_valid):
        check = is_valid
    elif isinstance(is_valid, str) or not isinstance(is_valid, Collection):
        raise ConfigurationError("verified() takes a predicate or a collection of keys")
    else:
        check = frozenset(is_valid).__contains__

    def identify(request: RequestView) -> Identity | None:
        found = read(request)
        if found is None or not check(found):
            return None
        return Identity.secret(found)

    identify.__qualname__ = f"verified({getattr(is_valid, '__qualname__', 'keys')})"
    return identify


def by_header(name: str, *, secret: bool = False) -> Callable[[RequestView], Identity | None]:
    """Identify by one header, e.g. an org id that an authenticating proxy sets.

    Only use a header a client cannot set itself (a gateway that authenticates and overwrites
    it); otherwise every invented value is a fresh bucket. ``secret=True`` redacts the value
    in messages, for headers that carry credentials.

    >>> identify = by_header("X-Org-Id")
    """

    def identify(request: RequestView) -> Identity | None:
        value = _present(request.header(name))
        if value is None:
            return None
        return Identity.secret(value) if secret else Identity.named(value)

    identify.__qualname__ = f"by_header({name!r})"
    return identify


def resolve(found: Identity | str | None) -> Identity | None:
    """Normalize what an identify callable returned; strings are names."""
    if found is None or isinstance(found, Identity):
        return found
    name = _present(str(found))
    return Identity.named(name) if name is not None else None
