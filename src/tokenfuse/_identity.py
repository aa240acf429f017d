"""Identities: who is spending, as a keyed hash for stores plus a label and an id for humans.

Whatever names a caller (an API key, an org header, ``scope("agent-42")``) is untrusted and
possibly secret. It never reaches a store or a log as is:

* an ``Identity`` keeps only ``SHA-256(kind, value)`` of the whole value, however long, and
  never shows it (not in ``repr``, not pickled);
* a fuse derives the store key from that digest with its deployment secret (``_secret.py``):
  ``HMAC-SHA256(secret, digest)``, 128 bits in hex;
* the **key id** is the first 12 hex characters of that keyed hash: stable across processes
  sharing the secret, and safe to show, log and type into admin tools;
* the **label** is the name itself for names the application chose (at most 64 printable
  characters), or a redaction of a credential that leaves at least 12 characters hidden
  (``sk-…a1b2``; shorter credentials show less, down to ``…``).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
from collections.abc import Callable
from functools import lru_cache
from typing import Any, Literal, NamedTuple, NoReturn

from ._errors import ConfigurationError
from ._secret import process_secret

__all__ = ["KEY_ID_LENGTH", "Identity", "Keyed", "redact"]

#: Hex characters of the keyed hash that make a key id (48 bits).
KEY_ID_LENGTH = 12

_LABEL_LENGTH = 64
_SECRET_TAIL = 4
_VENDOR_PREFIX = 4  # ``sk-``, ``pk-``, ``key-``: shown; a longer head is part of the secret
_HIDDEN_AT_LEAST = 12  # characters of a credential its label never shows fewer than
_IPV6_NETWORK = 64  # one host can use every address of its /64

Kind = Literal["name", "secret", "client"]


def _printable(value: str) -> str:
    return "".join(ch if ch.isprintable() else "?" for ch in value[:_LABEL_LENGTH])


def redact(secret: str) -> str:
    """A label for a credential that leaves at least 12 of its characters hidden.

    The vendor prefix (``sk-``) or first 3 characters, ``…``, and the last 4 characters when
    enough remains hidden between them; else the head alone; else nothing.

    >>> redact("sk-proj-0123456789abcdef"), redact("AIzaSyA-1234567890"), redact("123456")
    ('sk-…cdef', 'AIz…', '…')
    """
    secret = secret.strip()
    if not secret:
        return "(empty)"
    prefix, dash, _ = secret.partition("-")
    head = prefix + dash if dash and len(prefix) <= _VENDOR_PREFIX else secret[:3]
    hidden = len(secret) - len(head)
    if hidden - _SECRET_TAIL >= _HIDDEN_AT_LEAST:
        return _printable(head) + "…" + _printable(secret[-_SECRET_TAIL:])
    if hidden >= _HIDDEN_AT_LEAST:
        return _printable(head) + "…"
    return "…"


def _digest(kind: Kind, value: str) -> bytes:
    return hashlib.sha256(f"{kind}\x00{value}".encode("utf-8", "surrogatepass")).digest()


def _derived_digest(parent: bytes, parts: tuple[str, ...]) -> bytes:
    hashed = hashlib.sha256(b"derived\x00" + parent)
    for part in parts:  # length-prefixed, so that no two lists of parts hash alike
        encoded = part.encode("utf-8", "surrogatepass")
        hashed.update(len(encoded).to_bytes(8, "big") + encoded)
    return hashed.digest()


class Keyed(NamedTuple):
    """An identity's keyed hash under one secret: what stores and humans see of it."""

    hex: str
    """``HMAC-SHA256(secret, digest)``, 128 bits as 32 hex characters: the store key's part."""
    key_id: str
    """Its first ``KEY_ID_LENGTH`` characters: the id shown next to the label."""


class Identity:
    """Who a decision is about.

    ``label`` is what messages, logs and ``status()`` show; ``key_id`` tells identities apart
    where labels cannot (``sk-…a1b2``) and names one to admin tools. Equal identities are the
    same kind of the same value. Immutable; build them with ``named``, ``secret``, ``client``,
    ``of`` or ``derived`` (the constructor takes a digest those compute).

    >>> Identity.named("agent-42").label
    'agent-42'
    >>> Identity.secret("sk-proj-0123456789abcdef").label
    'sk-…cdef'
    >>> len(Identity.named("agent-42").key_id)
    12
    """

    __slots__ = ("_digest", "_keyed", "label")

    label: str
    _digest: bytes
    _keyed: tuple[bytes, Keyed] | None  # the last secret a fuse asked for, and its result

    def __init__(self, digest: bytes, label: str) -> None:
        object.__setattr__(self, "_digest", digest)
        object.__setattr__(self, "label", label)
        object.__setattr__(self, "_keyed", None)

    @staticmethod
    def named(name: str) -> Identity:
        """An identity the application chose (``"agent-42"``, an org id): shown as is."""
        return _named(name)

    @staticmethod
    def secret(secret: str) -> Identity:
        """An identity derived from a credential: hashed whole, and shown only redacted."""
        return _secret(secret)

    @staticmethod
    def client(address: str) -> Identity:
        """The identity of callers from one network address, as the middleware counts
        callers it cannot identify otherwise (``anonymous="client"``). An IPv6 address
        stands for its /64, which one host can use whole.

        >>> Identity.client("2001:db8:1:2::7").label
        'client 2001:db8:1:2::/64'
        """
        try:
            ip = ipaddress.ip_address(address.strip())
        except ValueError:
            raise ConfigurationError(f"not an IP address: {address[:64]!r}") from None
        return _client(_network_of(ip))

    def derived(self, *parts: str, label: str) -> Identity:
        """An identity made of this one and ``parts`` (a caller × a tool): hashed from this
        one's digest and the parts, so that neither reaches a store; shown as ``label``.

        >>> caller = Identity.named("agent-42")
        >>> caller.derived("tool", "refund", label="agent-42 tool refund").label
        'agent-42 tool refund'
        """
        return Identity(_derived_digest(self._digest, parts), label)

    @staticmethod
    def of(who: str | Identity) -> Identity:
        """Accept either form; a plain string is treated as an application-chosen name."""
        return who if isinstance(who, Identity) else _named(who)

    @property
    def key_id(self) -> str:
        """The short, non-secret id of this identity under the process's deployment secret
        (``TOKENFUSE_SECRET``). A fuse with a secret of its own shows ids derived with it:
        ``fuse.key_id(identity)``."""
        return self.keyed(process_secret()).key_id

    def keyed(self, secret: bytes) -> Keyed:
        """The keyed hash and key id of this identity under ``secret``. Cached for the last
        secret asked for: a fuse pays for the HMAC once per identity, not per call."""
        cached = self._keyed
        if cached is not None and cached[0] == secret:
            return cached[1]
        value = hmac.digest(secret, self._digest, "sha256")[:16].hex()
        keyed = Keyed(value, value[:KEY_ID_LENGTH])
        object.__setattr__(self, "_keyed", (secret, keyed))
        return keyed

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Identity) and self._digest == other._digest

    def __hash__(self) -> int:
        return hash(self._digest)

    def __repr__(self) -> str:
        return f"<Identity {self.label} [id {self.key_id}]>"

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError(f"Identity is immutable; cannot set {name!r}")

    def __reduce__(self) -> NoReturn:
        # Its digest is the unkeyed hash of a credential: it must not leave the process.
        raise TypeError("an Identity is not pickled; pass its name or credential instead")

    def __copy__(self) -> Identity:
        return self

    def __deepcopy__(self, memo: Any) -> Identity:
        return self


def _network_of(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, _IPV6_NETWORK), strict=False))
    return str(ip)


# The same few identities come back on every call, and hashing is the costly part of a
# MemoryStore decision: cache them, in bounded memory. Short values (API keys, names) share a
# large cache; long ones (JWTs) a small one; beyond that nothing is cached, so a flood of huge
# names costs at most 4096 x 128 + 256 x 4096 characters (1.5 MB) of cache.
_SHORT, _LONG = 128, 4096


def _cached(build: Callable[[str], Identity]) -> Callable[[str], Identity]:
    short = lru_cache(maxsize=4096)(build)
    long = lru_cache(maxsize=256)(build)

    def get(value: str) -> Identity:
        size = len(value)
        if size <= _SHORT:
            return short(value)
        return long(value) if size <= _LONG else build(value)

    return get


@_cached
def _named(name: str) -> Identity:
    return Identity(_digest("name", name), _printable(name) or "(empty)")


# Credentials are cached under a keyed hash of them, never as themselves: a cache keyed by the
# credential would keep every API key the process used in memory for as long as it is cached
# (and show it to anything that dumps the heap). BLAKE2b under a key made for this process:
# 128 bits, a fraction of a microsecond for an API key, and nothing outside the process can
# aim collisions at it. Every entry is the same small size whatever the credential's length,
# so one bound covers JWTs too.
# The keyed state is made once and copied for each credential: the same digest as
# ``blake2b(secret, key=..., digest_size=16)``, for a third of its cost.
_SECRETS_CACHED = 4096
_secrets: dict[bytes, Identity] = {}
_CACHE_HASH = hashlib.blake2b(key=os.urandom(32), digest_size=16)


def _secret(secret: str) -> Identity:
    hashed = _CACHE_HASH.copy()
    hashed.update(secret.encode("utf-8", "surrogatepass"))
    cache_key = hashed.digest()
    identity = _secrets.get(cache_key)
    if identity is None:
        identity = Identity(_digest("secret", secret), redact(secret))
        if len(_secrets) >= _SECRETS_CACHED:
            _secrets.clear()  # under churn, start over: bounded, and no order to keep
        _secrets[cache_key] = identity
    return identity


@lru_cache(maxsize=4096)  # bounded: an IPv4 address or an IPv6 /64 is at most 43 characters
def _client(network: str) -> Identity:
    return Identity(_digest("client", network), f"client {network}")
