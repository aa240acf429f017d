"""Inbound: what the middleware's options see of a request, whichever protocol carried it.

``identify``, ``cost``, ``tiers`` and ``exclude`` callables receive a ``RequestView``: the
method, the path, a header lookup and the raw ASGI scope or WSGI environ. It reads lazily, so
a request whose options need one header pays for one header.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from functools import lru_cache
from typing import Any

__all__ = ["AsgiRequest", "RequestView", "WsgiRequest"]


class RequestView:
    """A read-only view of the request being guarded.

    >>> def org(request: RequestView) -> str | None:
    ...     return request.header("x-org-id")
    """

    __slots__ = ("method", "path", "raw")

    method: str
    """``GET``, ``POST``, ..."""
    path: str
    """The path as the application is mounted (``/tools/refund``), without the query."""
    raw: MutableMapping[str, Any]
    """The ASGI scope or the WSGI environ, for what the view does not offer."""

    def __init__(self, method: str, path: str, raw: MutableMapping[str, Any]) -> None:
        self.method = method
        self.path = path
        self.raw = raw

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (any case), or None."""
        raise NotImplementedError

    def header_list(self, name: str) -> str | None:
        """Every value of list-valued header ``name`` joined by ``", "`` (RFC 9110, 5.3), so
        that a second ``X-Forwarded-For`` line is not missed; None when absent."""
        raise NotImplementedError

    @property
    def client(self) -> str | None:
        """The peer address as the server saw it (a proxy's, behind one)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.method} {self.path}>"


class AsgiRequest(RequestView):
    __slots__ = ("_headers",)

    def __init__(self, scope: MutableMapping[str, Any]) -> None:
        # ``RequestView.__init__``'s three fields, set here: one call fewer on every request.
        self.method = scope.get("method", "GET")
        self.path = scope.get("path", "/")
        self.raw = scope
        self._headers: dict[bytes, list[_Raw]] | None = None

    def header(self, name: str) -> str | None:
        # ``_values``, inlined: a request's options and the middleware look up several headers
        # (its credential, its run, whether it has a body), so a call fewer for each.
        headers = self._headers
        if headers is None:
            headers = self._headers = _header_map(self.raw.get("headers"))
        values = headers.get(_asgi_name(name))
        return bytes(values[0]).decode("latin-1") if values else None

    def header_list(self, name: str) -> str | None:
        values = self._values(name)
        return ", ".join([bytes(v).decode("latin-1") for v in values]) if values else None

    def _values(self, name: str) -> list[_Raw] | None:
        """Every value of header ``name``: the scope's headers are read once, at the first
        lookup, since a request's options and the middleware look up several."""
        headers = self._headers
        if headers is None:
            headers = self._headers = _header_map(self.raw.get("headers"))
        return headers.get(_asgi_name(name))

    @property
    def client(self) -> str | None:
        client = self.raw.get("client")
        return str(client[0]) if client else None


#: What an ASGI header value may be (servers send bytes; the spec allows no other).
_RAW = (bytes, bytearray, memoryview)
_Raw = bytes | bytearray | memoryview


def _header_map(headers: object) -> dict[bytes, list[_Raw]]:
    """The scope's headers: each name, as sent (ASGI servers send them lower-cased), to its
    values in order, decoded only when looked up (most never are). A pair that is not a name
    and a byte string is skipped: a broken server or test scope must not crash the user's
    request, and cannot name a header."""
    found: dict[bytes, list[_Raw]] = {}
    try:
        pairs = iter(headers)  # type: ignore[call-overload]  # checked here, not trusted
    except TypeError:
        return found
    for pair in pairs:
        try:
            name, value = pair
            values = found.get(name)
        except (TypeError, ValueError):  # not a pair, or a name that cannot be a key
            continue
        if not isinstance(value, _RAW):
            continue
        if values is None:
            found[name] = [value]
        else:
            values.append(value)
    return found


# The names looked up are the middleware's and the options' own (a few), not the request's.
@lru_cache(maxsize=256)
def _asgi_name(name: str) -> bytes:
    """A header name as ASGI servers send it: lower-cased bytes."""
    return name.lower().encode("latin-1")


class WsgiRequest(RequestView):
    __slots__ = ()

    def __init__(self, environ: MutableMapping[str, Any]) -> None:
        path = environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")
        super().__init__(environ.get("REQUEST_METHOD", "GET"), path or "/", environ)

    def header(self, name: str) -> str | None:
        key = name.upper().replace("-", "_")
        if key not in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            key = "HTTP_" + key
        value = self.raw.get(key)
        return value if isinstance(value, str) else None

    def header_list(self, name: str) -> str | None:
        return self.header(name)  # WSGI servers join repeated headers into one, as CGI does

    @property
    def client(self) -> str | None:
        value = self.raw.get("REMOTE_ADDR")
        return value if isinstance(value, str) else None


def mapping_of(request: object) -> Mapping[str, Any] | None:
    """The scope or environ behind a framework request (Starlette, Flask) or a view."""
    for attribute in ("raw", "scope", "environ"):
        value = getattr(request, attribute, None)
        if isinstance(value, MutableMapping):
            return value
    return request if isinstance(request, MutableMapping) else None
