"""The deployment secret: what keys the hash that turns an identity into a store key.

A store key is ``HMAC-SHA256(secret, SHA-256(kind, value))``: without the secret, a store key
(a Redis key name) or a key id (in a log line) cannot be turned back into the credential, even
a short one. Which secret a ``Fuse`` uses, first match wins:

1. ``Fuse(secret=...)``;
2. the ``TOKENFUSE_SECRET`` environment variable;
3. on a ``MemoryStore``, a random secret made once per process (the state never leaves the
   process, so nothing else needs to derive the same keys);
4. on a shared store (``RedisStore``), ``FALLBACK_SECRET``: a fixed, public value, so that the
   processes sharing the store still count each identity under one key. It protects nothing,
   and a warning says so once per process. Set a secret.

Every process sharing a store must use the same secret; changing it starts every identity
afresh (the old keys expire with their TTL). Generate one with
``python -c "import secrets; print(secrets.token_urlsafe(32))"``.
"""

from __future__ import annotations

import logging
import os
import secrets

from ._errors import ConfigurationError

__all__ = [
    "FALLBACK_SECRET",
    "MIN_SECRET_LENGTH",
    "SECRET_ENV",
    "SecretSource",
    "deployment_secret",
    "process_secret",
]

logger = logging.getLogger("tokenfuse")

#: The environment variable every process of a deployment reads its secret from.
SECRET_ENV = "TOKENFUSE_SECRET"
#: What a shared store falls back to without a secret. Public, so it protects nothing.
FALLBACK_SECRET = b"tokenfuse-fallback-secret-v1: set TOKENFUSE_SECRET"
#: Shorter secrets could be guessed from one known credential and its store key.
MIN_SECRET_LENGTH = 16

#: A secret given as an argument or in the environment.
SecretSource = str | bytes

_PER_PROCESS = secrets.token_bytes(32)
_warned_fallback = False


def _checked(secret: SecretSource, origin: str) -> bytes:
    raw = secret.encode("utf-8", "surrogatepass") if isinstance(secret, str) else secret
    if not isinstance(raw, bytes):
        raise ConfigurationError(f"{origin} must be a str or bytes, not {type(secret).__name__}")
    if len(raw) < MIN_SECRET_LENGTH:
        raise ConfigurationError(
            f"{origin} must be at least {MIN_SECRET_LENGTH} characters (make one with: "
            'python -c "import secrets; print(secrets.token_urlsafe(32))")'
        )
    return raw


def _from_environment() -> bytes | None:
    value = os.environ.get(SECRET_ENV)
    return _checked(value, SECRET_ENV) if value else None


def process_secret() -> bytes:
    """The secret of this process when no fuse names one: ``TOKENFUSE_SECRET``, else the
    random per-process one. ``Identity.key_id`` is derived under it."""
    return _from_environment() or _PER_PROCESS


def deployment_secret(secret: SecretSource | None, *, shared: bool) -> bytes:
    """The secret a fuse derives its store keys with (the order is in the module docstring).

    ``shared``: the store is seen by other processes, which must derive the same keys.

    >>> deployment_secret("a-secret-of-16-chars+", shared=True)
    b'a-secret-of-16-chars+'
    """
    if secret is not None:
        return _checked(secret, "secret")
    configured = _from_environment()
    if configured is not None:
        return configured
    if not shared:
        return _PER_PROCESS
    _warn_fallback()
    return FALLBACK_SECRET


def _warn_fallback() -> None:
    global _warned_fallback
    if not _warned_fallback:
        _warned_fallback = True
        logger.warning(
            "tokenfuse: no deployment secret is set, so identities on the shared store are "
            "hashed with a public fallback: a short API key can be recovered from its store "
            "key. Set %s (the same value in every process sharing the store) or pass "
            "Fuse(secret=...).",
            SECRET_ENV,
        )
