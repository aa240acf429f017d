"""Inbound: the client address of a request, for callers without a verified identity.

With ``anonymous="client"`` a request that brings no (verified) identity is counted for the
address it came from, so inventing a new API key per request buys no new bucket. The address
is the peer the server saw, unless that peer is one of the ``trusted_proxies``: then, and only
then, ``X-Forwarded-For`` is read from its right end (the hops the trusted proxies appended)
to the first address that is not a trusted proxy. Entries to the left of it were written by
the client and are never believed.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from .._errors import ConfigurationError
from .._identity import Identity
from .request import RequestView

__all__ = ["ClientAddress"]

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_MAX_HOPS = 32  # a longer X-Forwarded-For chain is read no further than this from its end
_MAX_HEADER = 4096


def _address(value: str) -> Address | None:
    value = value.strip()
    if value.startswith("[") and "]" in value:  # ``[2001:db8::1]:4711``
        value = value[1 : value.index("]")]
    elif value.count(":") == 1:  # ``203.0.113.7:4711``
        value = value.partition(":")[0]
    try:
        return ipaddress.ip_address(value)
    except ValueError:
        return None


def _networks(trusted: Iterable[str]) -> tuple[Network, ...]:
    if isinstance(trusted, str):
        raise ConfigurationError("trusted_proxies takes a list of networks, not one string")
    networks = []
    for entry in trusted:
        try:
            networks.append(ipaddress.ip_network(str(entry).strip(), strict=False))
        except ValueError:
            raise ConfigurationError(
                f"trusted_proxies: {entry!r} is not an IP address or network (CIDR)"
            ) from None
    return tuple(networks)


class ClientAddress:
    """``request -> Identity.client(address)``, believing ``X-Forwarded-For`` only from
    ``trusted`` proxies (IP addresses or CIDR networks).

    >>> from tokenfuse._middleware.request import AsgiRequest
    >>> peer = {"client": ("10.0.0.5", 4711), "headers": [(b"x-forwarded-for", b"203.0.113.7")]}
    >>> ClientAddress(["10.0.0.0/8"])(AsgiRequest(peer)).label
    'client 203.0.113.7'
    >>> ClientAddress([])(AsgiRequest(peer)).label
    'client 10.0.0.5'
    """

    __slots__ = ("_trusted",)

    def __init__(self, trusted: Iterable[str] = ()) -> None:
        self._trusted = _networks(trusted)

    def _is_trusted(self, address: Address) -> bool:
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return any(address in network for network in self._trusted)

    def address(self, request: RequestView) -> Address | None:
        """The client's address; None when the server reports no peer (a Unix socket)."""
        peer = request.client
        address = _address(peer) if peer is not None else None
        if address is None or not self._trusted or not self._is_trusted(address):
            return address
        forwarded = request.header_list("x-forwarded-for")
        if not forwarded:
            return address
        hops = forwarded[-_MAX_HEADER:].split(",")[-_MAX_HOPS:]
        for hop in reversed(hops):
            found = _address(hop)
            if found is None:
                return address  # garbage: the last hop we could believe is the best we know
            address = found
            if not self._is_trusted(found):
                return found
        return address

    def __call__(self, request: RequestView) -> Identity | None:
        address = self.address(request)
        return Identity.client(str(address)) if address is not None else None
