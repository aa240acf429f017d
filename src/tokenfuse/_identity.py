"""Identities, for both sides: who is spending, as a storage-safe key and a human label.

Whatever names a caller (an API key, an org header, ``scope("agent-42")``) is untrusted and
possibly secret. It never reaches a store or a log as is: the store key is a hash of it,
and the label is either the name itself (for names the application chose) or a redaction that
shows just enough to tell keys apart (``sk-…a1b2``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["KEY_ID_LENGTH", "MAX_IDENTITY_LENGTH", "Identity"]

#: Longer identities are cut before hashing and labelling: bounds work per request.
MAX_IDENTITY_LENGTH = 512

#: Hex characters of the store key that make a key id: 48 bits, so two of a million keys share
#: one with a chance of about 0.2 %; a lookup that matches two says so and asks for more.
KEY_ID_LENGTH = 12

_LABEL_LENGTH = 64
_SECRET_TAIL = 4


def _digest(kind: str, value: str) -> str:
    # 128 bits of SHA-256: collisions are out of reach, and keys stay short in Redis.
    raw = f"{kind}\x00{value[:MAX_IDENTITY_LENGTH]}".encode("utf-8", "surrogatepass")
    return hashlib.sha256(raw).hexdigest()[:32]


def _printable(value: str) -> str:
    return "".join(ch if ch.isprintable() else "?" for ch in value[:_LABEL_LENGTH])


def redact(secret: str) -> str:
    """``sk-proj-abc…`` -> ``sk-…a1b2``: the first dash-separated prefix and the last 4 chars."""
    secret = secret.strip()
    if len(secret) <= 2 * _SECRET_TAIL:
        return "…" + _printable(secret[-2:]) if secret else "(empty)"
    prefix, dash, _ = secret.partition("-")
    # Keep a short vendor prefix (``sk-``, ``sk-ant-`` -> ``sk-``) but never a long secret head.
    head = prefix + "-" if dash and len(prefix) <= 4 else secret[:3]
    return _printable(head) + "…" + _printable(secret[-_SECRET_TAIL:])


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a decision is about.

    ``key`` is what stores see (a hash, safe as a Redis key); ``label`` is what messages,
    logs and ``status()`` show.

    >>> Identity.named("agent-42").label
    'agent-42'
    >>> Identity.secret("sk-proj-0123456789abcdef").label
    'sk-…cdef'
    """

    key: str
    label: str

    @property
    def key_id(self) -> str:
        """A short, stable, non-secret handle on this identity: the first 12 hex characters of
        its store key, shown next to the label so an operator can address the key
        (``tokenfuse reset 3f9a0c…``) without holding the credential.

        >>> Identity.named("agent-42").key_id == Identity.named("agent-42").key[:12]
        True
        """
        return self.key[:KEY_ID_LENGTH]

    @staticmethod
    def named(name: str) -> Identity:
        """An identity the application chose (``"agent-42"``, an org id): shown as is."""
        return _named(name)

    @classmethod
    def secret(cls, secret: str) -> Identity:
        """An identity derived from a credential: hashed, and shown only redacted."""
        return cls(key=_digest("secret", secret), label=redact(secret))

    @staticmethod
    def of(who: str | Identity) -> Identity:
        """Accept either form; a plain string is treated as an application-chosen name."""
        return who if isinstance(who, Identity) else _named(who)


# The same few names come back on every call; hashing is the costly part of a MemoryStore
# decision. Bounded, so a flood of distinct names cannot grow it.
@lru_cache(maxsize=4096)
def _named(name: str) -> Identity:
    return Identity(key=_digest("name", name), label=_printable(name) or "(empty)")
