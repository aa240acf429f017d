"""Outbound side: who a call through ``FuseTransport`` is spending for.

Resolution order, most specific first:

1. ``request.extensions["tokenfuse"]["key"]``: one request names its identity;
2. ``with tokenfuse.scope("agent-42"):``: every call made inside the block (asyncio tasks
   started inside it inherit the scope; threads do not, as with every context variable);
3. the transport's ``key=``: a fixed name, or a callable of the request (``None`` falls through);
4. the credential the request carries (``Authorization: Bearer``, ``x-api-key``, ``api-key``,
   ``x-goog-api-key``, ``?key=``, the access key id of an AWS SigV4 signature), hashed and shown
   only redacted (``sk-…a1b2``);
5. no credential at all (a local model server): the host, as a named identity.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeAlias

from .._identity import Identity
from .compat import header_entries

__all__ = ["KeyOption", "KeyResolver", "current_scope", "scope"]

#: A fixed identity, or a function of the request (``httpx.Request`` / ``httpx2.Request``).
KeyOption: TypeAlias = "str | Identity | Callable[[Any], str | Identity | None] | None"

_API_KEY_HEADERS = (b"x-api-key", b"api-key", b"x-goog-api-key")
_CREDENTIAL_HEADERS = frozenset((b"authorization", *_API_KEY_HEADERS))

_scope: ContextVar[Identity | None] = ContextVar("tokenfuse_scope", default=None)


@contextmanager
def scope(who: str | Identity) -> Iterator[Identity]:
    """Count every guarded call made inside the block for ``who``.

    One process can then run many agents, each with its own rate, baseline and fuse, over one
    client and one API key::

        with tokenfuse.scope("agent-42"):
            client.chat.completions.create(...)

    Scopes nest (the innermost wins) and follow asyncio tasks created inside the block.
    """
    identity = Identity.of(who)
    token = _scope.set(identity)
    try:
        yield identity
    finally:
        _scope.reset(token)


def current_scope() -> Identity | None:
    """The identity of the innermost ``scope()`` block around the caller, if any."""
    return _scope.get()


def _header_credential(headers: Any) -> str | None:
    # One pass over the header list: cheaper than a case-insensitive lookup per name.
    found: dict[bytes, bytes] = {}
    for _, lowered, value in header_entries(headers):
        if lowered in _CREDENTIAL_HEADERS:
            found.setdefault(lowered, value)
    if not found:
        return None
    authorization = found.get(b"authorization")
    if authorization:
        secret = _from_authorization(authorization.decode("latin-1"))
        if secret:
            return secret
    for name in _API_KEY_HEADERS:
        key = found.get(name)
        if key and key.strip():
            return key.decode("latin-1").strip()
    return None


def _param_credential(params: Mapping[str, str]) -> str | None:
    key = params.get("key")
    return key.strip() or None if key else None


def _from_authorization(value: str) -> str | None:
    scheme, _, rest = value.strip().partition(" ")
    rest = rest.strip()
    if scheme.lower() == "bearer":
        return rest or None
    if scheme.upper().startswith("AWS4-"):
        # SigV4 signs every request differently; the access key id names the credential.
        for part in rest.split(","):
            name, _, credential = part.strip().partition("=")
            if name == "Credential":
                return credential.partition("/")[0] or None
    return value.strip() or None


class KeyResolver:
    """Resolves the identity of one outbound request (the order is in the module docstring)."""

    __slots__ = ("_call", "_fixed")

    def __init__(self, key: KeyOption = None) -> None:
        self._fixed: Identity | None = None
        self._call: Callable[[Any], str | Identity | None] | None = None
        if isinstance(key, (str, Identity)):
            self._fixed = Identity.of(key)
        elif callable(key):
            self._call = key
        elif key is not None:
            raise TypeError(f"key must be a str, an Identity or a callable, not {key!r}")

    def __call__(self, request: Any) -> Identity:
        options = request.extensions.get("tokenfuse")
        if options is not None and isinstance(options, Mapping):  # None: skip the ABC check
            asked = options.get("key")
            if isinstance(asked, (str, Identity)):
                return Identity.of(asked)
        scoped = _scope.get()
        if scoped is not None:
            return scoped
        if self._fixed is not None:
            return self._fixed
        if self._call is not None:
            chosen = self._call(request)
            if chosen is not None:
                return Identity.of(chosen)
        url = request.url
        secret = _header_credential(request.headers)
        if secret is None and url.query:  # the query is parsed only when it may be needed
            secret = _param_credential(url.params)
        if secret is not None:
            return Identity.secret(secret)  # cached per credential, in bounded memory
        return Identity.named(f"host:{url.host or 'unknown'}")
