"""The meter's view of a response's headers: what the usage side reads, without decoding every
header of every response."""

from __future__ import annotations

import httpx
import pytest

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


@pytest.mark.parametrize("decoded", [False, True])
def test_the_headers_read_as_the_dict_of_their_items(decoded: bool) -> None:
    headers = httpx.Headers(RAW)
    expected = dict(headers.items())
    if decoded:  # the client decoded the body already: its coding is no more
        del expected["content-encoding"]
    names = [*expected, "content-encoding", "absent", "Content-Type"]
    looked_up = _ResponseHeaders(headers, decoded=decoded)
    assert {name: looked_up.get(name) for name in names} == {
        name: expected.get(name) for name in names
    }
    assert looked_up.get("absent", "default") == "default"
    assert ("content-encoding" in looked_up) is not decoded
    with pytest.raises(KeyError):
        looked_up["absent"]
    # Iterated whole (a registered extractor's ResponseInfo), before or after lookups.
    assert dict(looked_up.items()) == expected
    assert dict(_ResponseHeaders(headers, decoded=decoded)) == expected
    assert len(looked_up) == len(expected)
