"""How an operator names a key: by its key id, by a name, or by a credential said to be one.

A raw string is never silently taken as one of the three: ``KeyRef.parse`` (what the CLI's
positional ``KEY`` becomes) may stand for a key id or a name, and is refused when it looks like
a credential or a redacted label, with what to pass instead. ``KeyRef.secret`` is the explicit
way to address a key by its credential: it is hashed and never shown.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from .._errors import TokenFuseError
from .._identity import KEY_ID_LENGTH, Identity

__all__ = [
    "AmbiguousKey",
    "KeyNotFound",
    "KeyRef",
    "RefKind",
    "looks_like_credential",
    "looks_like_key_id",
]

RefKind = Literal["id", "name", "secret", "any"]

_HEX = re.compile(r"^[0-9a-f]{4,32}$")
# Prefixes of well-known API keys and tokens (OpenAI, Anthropic, Google, AWS, GitHub, Slack, ...).
_CREDENTIAL_PREFIXES = (
    "sk-", "sk_", "pk-", "pk_", "rk-", "rk_", "AIza", "AKIA", "ASIA", "ghp_", "gho_", "ghs_",
    "github_pat_", "xoxb-", "xoxp-", "xai-", "gsk_", "hf_", "glpat-", "Bearer ", "eyJ",
)  # fmt: skip
_TOKEN_LIKE = re.compile(r"^[A-Za-z0-9_\-+/=.]{24,}$")


def looks_like_key_id(text: str) -> bool:
    """4 to 32 lower-case hex characters: the start of a store key, as key ids are."""
    return bool(_HEX.match(text))


def looks_like_credential(text: str) -> bool:
    """A known API-key prefix, or a long unbroken token mixing letters and digits."""
    if text.startswith(_CREDENTIAL_PREFIXES):
        return True
    if not _TOKEN_LIKE.match(text) or looks_like_key_id(text):
        return False
    return any(c.isdigit() for c in text) and any(c.isalpha() for c in text)


class KeyNotFound(TokenFuseError, LookupError):
    """No key matches what an operator named."""


class AmbiguousKey(TokenFuseError, LookupError):
    """What an operator named could be more than one key; the message says what to pass."""


@dataclass(frozen=True, slots=True)
class KeyRef:
    """A key as an operator names it.

    >>> KeyRef.parse("agent-42").kind
    'any'
    >>> KeyRef.secret("sk-live-0123456789abcdef")
    KeyRef(secret 'sk-…cdef')
    """

    kind: RefKind
    text: str

    @classmethod
    def key_id(cls, text: str) -> KeyRef:
        """A key id as shown next to every label (or its start, at least 4 characters)."""
        text = text.strip().lower()
        if not looks_like_key_id(text):
            raise KeyNotFound(f"{text!r} is no key id: key ids are {KEY_ID_LENGTH} hex characters")
        return cls("id", text)

    @classmethod
    def name(cls, text: str) -> KeyRef:
        """A name the application chose (``scope("agent-42")``, ``key="agent-42"``)."""
        return cls("name", text)

    @classmethod
    def secret(cls, text: str) -> KeyRef:
        """A credential the key is counted by (an API key, a bearer token): hashed, never shown."""
        return cls("secret", text.strip())

    @classmethod
    def parse(cls, text: str) -> KeyRef:
        """What a bare ``KEY`` argument says: a key id or a name, never a credential or a
        redacted label (each is refused with what to pass instead)."""
        text = text.strip()
        if "…" in text or "..." in text:
            raise KeyNotFound(
                f"{text!r} is a redacted label, which many keys may share: pass the key id "
                "shown next to it, or the credential itself with --secret"
            )
        if looks_like_credential(text):
            raise AmbiguousKey(
                f"{_shown(text)} looks like a credential: pass it with --secret (it is hashed, "
                "never stored or shown), or with --name if it really is a name"
            )
        return cls("any", text)

    def identity(self) -> Identity:
        """The identity of a name or a credential (a key id names no identity by itself)."""
        if self.kind == "secret":
            return Identity.secret(self.text)
        return Identity.named(self.text)

    def __repr__(self) -> str:
        return f"KeyRef({self.kind} {_shown(self.text) if self.kind == 'secret' else self.text!r})"

    def __str__(self) -> str:
        return _shown(self.text) if self.kind == "secret" else self.text


def _shown(text: str) -> str:
    return repr(Identity.secret(text).label)
