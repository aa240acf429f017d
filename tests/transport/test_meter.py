"""The meter's view of a response's headers: what the usage side reads, without decoding every
header of every response."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import httpx2
import pytest

from tokenfuse._transport.compat import header_entries
from tokenfuse._transport.meter import _ResponseHeaders

RAW = [
    (b"Content-Type", b"text/event-stream; charset=utf-8"),
    (b"X-Request-Id", b"req-1"),
    (b"content-encoding", b"gzip"),
    (b"Set-Cookie", b"a=1"),
    (b"SET-COOKIE", b"b=2"),
    (b"X-Amzn-Bedrock-Input-Token-Count", b"12"),
    (b"X-Note", "caf\u00e9".encode("latin-1")),  # not UTF-8: the headers decode as latin-1
]

#: Values that are not ASCII, decoded as httpx decodes them: UTF-8 when every header is.
UTF8 = [
    (b"Content-Type", b"application/json"),
    (b"X-Title", "r\u00e9sum\u00e9 \u2014 \u4e2d\u6587".encode()),
    (b"X-Caf\xc3\xa9", b"1"),  # a name that is not ASCII either
]
#: One name sent twice, in two cases: joined with ", ", as ``headers.items()`` joins them.
TWICE = [
    (b"content-type", b"application/json"),
    (b"Content-Type", b"text/plain; charset=utf-8"),
    (b"X-Other", b"x"),
]


class _RawOnly:
    """Headers of a kind without the libraries' private list: only the public ``raw`` and
    ``encoding``, which ``header_entries`` falls back to."""

    def __init__(self, headers: httpx.Headers) -> None:
        self._inner = headers

    @property
    def raw(self) -> list[tuple[bytes, bytes]]:
        return self._inner.raw

    @property
    def encoding(self) -> str:
        return self._inner.encoding

    def items(self) -> Any:
        return self._inner.items()


#: Each way headers reach the meter: either library's own, or a type without ``_list``.
KINDS: dict[str, Callable[[list[tuple[bytes, bytes]]], Any]] = {
    "httpx": httpx.Headers,
    "httpx2": httpx2.Headers,
    "raw only": lambda raw: _RawOnly(httpx.Headers(raw)),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("raw", [RAW, UTF8, TWICE], ids=["latin-1", "utf-8", "twice"])
def test_header_entries_are_each_header_in_order_with_its_name_in_lower_case(
    kind: str, raw: list[tuple[bytes, bytes]]
) -> None:
    headers = KINDS[kind](raw)
    assert list(header_entries(headers)) == [(name, name.lower(), value) for name, value in raw]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("raw", [RAW, UTF8, TWICE], ids=["latin-1", "utf-8", "twice"])
@pytest.mark.parametrize("decoded", [False, True])
def test_the_headers_read_as_the_dict_of_their_items(
    kind: str, raw: list[tuple[bytes, bytes]], decoded: bool
) -> None:
    headers = KINDS[kind](raw)
    expected = dict(headers.items())
    if decoded:  # the client decoded the body already: its coding is no more
        expected.pop("content-encoding", None)
    names = [*expected, "content-encoding", "absent", "Content-Type", "x-caf\u00e9"]
    looked_up = _ResponseHeaders(headers, decoded=decoded)
    assert {name: looked_up.get(name) for name in names} == {
        name: expected.get(name) for name in names
    }
    assert looked_up.get("absent", "default") == "default"
    assert ("content-encoding" in looked_up) is (not decoded and raw is RAW)
    with pytest.raises(KeyError):
        looked_up["absent"]
    # Iterated whole (a registered extractor's ResponseInfo), before or after lookups.
    assert dict(looked_up.items()) == expected
    assert dict(_ResponseHeaders(headers, decoded=decoded)) == expected
    assert len(looked_up) == len(expected)
