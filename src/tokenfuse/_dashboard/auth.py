"""Who may use the admin app: a bearer token, same-origin requests, loopback without a token.

* Every API request (``/api/…``, ``/metrics``) carries ``Authorization: Bearer <token>``,
  compared in constant time (both sides hashed first, so not even the length leaks). The
  page itself (``/`` and its static files) holds no data and is served to anyone: it asks
  for the token and keeps it in the tab's ``sessionStorage``.
* The token travels in a header, never a cookie, so a forged cross-site request carries
  none; on top of that a request whose ``Origin`` (or ``Sec-Fetch-Site``) says it comes from
  another site is refused, whatever its method.
* With no token configured the app refuses to be built unless told
  ``allow_no_token_on_loopback=True``, and then answers only requests that reach it on a
  loopback address from a loopback address.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Iterable, Mapping

from .._errors import ConfigurationError

__all__ = ["MIN_TOKEN_LENGTH", "Gatekeeper", "is_loopback"]

#: Shorter tokens are refused: an admin token guards every key's limits.
MIN_TOKEN_LENGTH = 16


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` (an address, or ``localhost``) is this machine's loopback."""
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


class Gatekeeper:
    """Decides each request: ``refusal(...)`` is None to let it through, or why not.

    >>> keeper = Gatekeeper("s3cret-admin-token-0123", allow_no_token_on_loopback=False)
    >>> keeper.refusal(headers={}, client="127.0.0.1", server="127.0.0.1", scheme="http")
    (401, 'missing or wrong admin token: send Authorization: Bearer <token>')
    """

    def __init__(
        self,
        token: str | None,
        *,
        allow_no_token_on_loopback: bool,
        allowed_origins: Iterable[str] = (),
    ) -> None:
        if token is None and not allow_no_token_on_loopback:
            raise ConfigurationError(
                "the admin app needs token=...: it can reset any key and change any limit "
                "(allow_no_token_on_loopback=True serves it without one, to loopback only)"
            )
        if token is not None and len(token) < MIN_TOKEN_LENGTH:
            raise ConfigurationError(
                f"the admin token must be at least {MIN_TOKEN_LENGTH} characters long"
            )
        self._digest = _digest(token) if token is not None else None
        self._origins = {origin.rstrip("/").lower() for origin in allowed_origins}

    @property
    def needs_token(self) -> bool:
        return self._digest is not None

    def refusal(
        self, *, headers: Mapping[str, str], client: str | None, server: str | None, scheme: str
    ) -> tuple[int, str] | None:
        """(status, reason) for a request that must be refused, else None. ``headers`` are
        lower-cased names."""
        if not self._same_site(headers, scheme):
            return 403, "cross-origin requests are refused"
        if self._digest is None:
            if is_loopback(client) and is_loopback(server):
                return None
            return 403, "no admin token is configured: this admin answers loopback only"
        scheme_name, _, given = headers.get("authorization", "").partition(" ")
        if scheme_name.lower() == "bearer" and hmac.compare_digest(
            _digest(given.strip()), self._digest
        ):
            return None
        return 401, "missing or wrong admin token: send Authorization: Bearer <token>"

    def _same_site(self, headers: Mapping[str, str], scheme: str) -> bool:
        origin = headers.get("origin")
        origin = origin.rstrip("/").lower() if origin is not None else None
        if origin is not None and origin in self._origins:
            return True  # a page served elsewhere on purpose (``allowed_origins``)
        if headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
            return False
        if origin is None:
            return True  # browsers send none on same-origin GETs; other clients are no CSRF
        return origin == f"{scheme}://{headers.get('host', '')}".lower()
