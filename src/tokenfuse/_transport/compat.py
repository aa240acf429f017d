"""httpx 0.28 and httpx2 2.x: which library a request belongs to, and its classes.

The two libraries share one transport interface but not one class hierarchy, and each client
checks that a response stream is an instance of *its own* ``SyncByteStream`` or
``AsyncByteStream``. So the transport learns the library from the request it is handed (a
dict lookup on the request's type) and wraps streams in classes built once per library.
Neither library is imported here until a request of it arrives: tokenfuse imports without
either installed, and with only one.

Both keep a message's headers the same way too, which the transport reads on every call
(``header_entries``), and a URL's host and path as ASCII bytes (``endpoint_of``).
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

__all__ = ["Endpoint", "Flavor", "endpoint_of", "flavor_of", "header_entries"]

_LIBRARIES = ("httpx", "httpx2")


@dataclass(frozen=True, slots=True, eq=False)
class Flavor:
    """One HTTP library: the names the transport needs from it."""

    name: str
    module: ModuleType
    sync_stream_base: type[Any]
    async_stream_base: type[Any]

    def http_transport(self) -> Any:
        """The library's own default transport (a connection pool over real sockets)."""
        return self.module.HTTPTransport()

    def async_http_transport(self) -> Any:
        return self.module.AsyncHTTPTransport()


_flavors: dict[type[Any], Flavor] = {}
_by_module: dict[str, Flavor] = {}
_lock = threading.Lock()


def _load(module_name: str) -> Flavor:
    flavor = _by_module.get(module_name)
    if flavor is None:
        module = importlib.import_module(module_name)
        flavor = Flavor(
            name=module_name,
            module=module,
            sync_stream_base=module.SyncByteStream,
            async_stream_base=module.AsyncByteStream,
        )
        _by_module[module_name] = flavor
    return flavor


def flavor_of(request: object) -> Flavor:
    """The library ``request`` comes from (``httpx.Request`` or ``httpx2.Request``).

    Both libraries set ``__module__`` of their public classes to the package name; with
    ``httpx2.alias_httpx()`` the two names are one module, and httpx2 is what it reports.
    """
    kind = type(request)
    flavor = _flavors.get(kind)
    if flavor is not None:
        return flavor
    # A subclass of Request defined elsewhere still belongs to the library of its base.
    roots = (cls.__module__.partition(".")[0] for cls in kind.__mro__)
    root = next((name for name in roots if name in _LIBRARIES), None)
    if root is None:
        raise TypeError(
            f"FuseTransport handles httpx and httpx2 requests, not {kind.__module__}."
            f"{kind.__qualname__}"
        )
    with _lock:
        flavor = _flavors[kind] = _load(root)
    return flavor


#: One header as both libraries keep it: its name as sent, that name in lower case, its value.
HeaderEntry = tuple[bytes, bytes, bytes]


def header_entries(headers: Any) -> Sequence[HeaderEntry]:
    """Every header of ``headers`` (an ``httpx.Headers``/``httpx2.Headers``), in order, with
    its name already lower-cased: read, never to be changed.

    Both libraries keep exactly these triples in ``Headers._list``: read directly, it costs
    nothing, where ``headers.raw`` builds a new list of pairs on every call and each name
    would be lower-cased again. Any other headers type (one without that list) is read
    through its public ``raw`` (``tests/transport/test_meter.py`` runs both ways, on each
    library, so a library that changed its list would fail there, not read wrong).
    """
    entries = getattr(headers, "_list", None)
    if type(entries) is list:
        return entries
    return [(name, name.lower(), value) for name, value in headers.raw]


#: A request's host (lower-cased) and its path as sent (still %-encoded, without the query;
#: "/" when empty): what the usage side and the failure-loop breaker both name a call by.
Endpoint = tuple[str, str]


def endpoint_of(url: Any) -> Endpoint | None:
    """The ``Endpoint`` of an httpx/httpx2 URL, read once per call for every step that needs
    it (each would otherwise ask the URL for its bytes and decode them again), or None when
    its host or path is not ASCII (neither library makes such a URL; the steps then read
    the URL their own way, as they always have)."""
    try:
        host = url.raw_host.decode("ascii").lower()  # as `urlsplit(...).hostname`
        path = url.raw_path.decode("ascii").partition("?")[0]
    except Exception:
        return None
    return host, path
