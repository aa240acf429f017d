"""Content-encoding: decoded on a copy, incrementally, with a bound against bombs."""

from __future__ import annotations

import gzip
import lzma
import zlib

import brotli
import pytest

from tokenfuse._usage import decoding
from tokenfuse._usage.decoding import BodyDecoder, UnsupportedEncoding, make_decoder

from .samples import ANTHROPIC_MESSAGE, BODIES, STREAMS, assert_counts, read, reader_for


def decode_all(header: str, body: bytes, step: int = 1000) -> bytes:
    decoder = make_decoder(header)
    assert decoder is not None
    out = b"".join(
        piece for i in range(0, len(body), step) for piece in decoder.decode(body[i : i + step])
    )
    assert decoder.problem is None
    return out


@pytest.mark.parametrize("header", [None, "", "identity", " Identity , identity"])
def test_identity_needs_no_decoder(header: str | None) -> None:
    assert make_decoder(header) is None


@pytest.mark.parametrize("header", ["gzip", "x-gzip", "GZIP"])
def test_gzip_names(header: str) -> None:
    assert decode_all(header, gzip.compress(b"hello")) == b"hello"


def test_concatenated_gzip_members() -> None:
    assert decode_all("gzip", gzip.compress(b"hel") + gzip.compress(b"lo"), step=3) == b"hello"


@pytest.mark.parametrize("first_chunk", [1, 2, 5])
def test_deflate_zlib_wrapped_and_raw(first_chunk: int) -> None:
    body = b"usage " * 100
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    for compressed in (zlib.compress(body), raw.compress(body) + raw.flush()):
        assert decode_all("deflate", compressed, step=first_chunk) == body


def test_multiple_codings_are_undone_in_reverse_order() -> None:
    body = ANTHROPIC_MESSAGE.body
    twice = bytes(brotli.compress(gzip.compress(body)))  # gzip applied first, then br
    assert decode_all("gzip, br", twice, step=17) == body
    usage = read(ANTHROPIC_MESSAGE, [twice], encoding="gzip, br")
    assert_counts(usage, ANTHROPIC_MESSAGE)


@pytest.mark.parametrize(
    ("header", "problem"),
    [
        ("compress", "compress not decodable"),
        ("zstd-ish", "zstd-ish not decodable"),
        ("gzip, gzip, gzip, gzip, gzip", "too many content-codings"),
    ],
)
def test_unsupported_codings_are_unknown(header: str, problem: str) -> None:
    with pytest.raises(UnsupportedEncoding, match=problem):
        make_decoder(header)
    reader = reader_for(ANTHROPIC_MESSAGE.url, encoding=header)
    assert reader is not None
    reader.feed(b"\x1f\x8b whatever")
    usage = reader.finish(complete=True)
    assert (usage.total, usage.problem) == (None, problem)


def test_br_without_a_bounded_brotli_is_not_decodable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decoding, "_brotli", None)
    usage = read(ANTHROPIC_MESSAGE, coding="br")
    assert (usage.total, usage.problem) == (None, "br not decodable")


def test_zstd_is_unknown_when_not_available(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decoding, "_zstd", None)
    with pytest.raises(UnsupportedEncoding, match="zstd not decodable"):
        make_decoder("zstd")


def test_bounded_stage_with_the_lzma_api(monkeypatch: pytest.MonkeyPatch) -> None:
    # compression.zstd (Python 3.14) has the lzma decompressor API; lzma stands in for it here.
    monkeypatch.setattr(
        decoding, "_zstd", type("Z", (), {"ZstdDecompressor": lzma.LZMADecompressor})
    )
    body = STREAMS["anthropic"].body
    usage = read(STREAMS["anthropic"], [lzma.compress(body)], encoding="zstd")
    assert_counts(usage, STREAMS["anthropic"])
    bomb = lzma.compress(b"\0" * 5_000_000)
    decoder = BodyDecoder([decoding._Bounded(lzma.LZMADecompressor)], "zstd", 1_000_000)
    assert sum(len(p) for p in decoder.decode(bomb)) <= 1_000_000
    assert decoder.problem == "decoded body too large; rest not inspected"


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br"])
def test_corrupt_compressed_body(coding: str) -> None:
    sample = BODIES["openai-chat"]
    usage = read(sample, [b"\x1f\x8b\x08\x00garbage" * 10], encoding=coding)
    assert usage.total is None
    assert usage.problem == f"{coding} body could not be decoded"


def test_plain_body_labelled_gzip_is_not_counted() -> None:
    sample = BODIES["openai-chat"]
    usage = read(sample, [sample.body], encoding="gzip")
    assert (usage.total, usage.problem) == (None, "gzip body could not be decoded")


ZEROS = b"\0" * (16 * 1024 * 1024)
BOMBS = {
    "gzip": gzip.compress(ZEROS, 9),
    "deflate": zlib.compress(ZEROS, 9),
    "br": bytes(brotli.compress(ZEROS, quality=1)),
}


@pytest.mark.parametrize("coding", BOMBS)
def test_zip_bomb_is_bounded(coding: str) -> None:
    bomb = BOMBS[coding]
    assert len(bomb) < 100_000
    decoder = make_decoder(coding, limit=2 * 1024 * 1024)
    assert decoder is not None
    pieces = [len(p) for p in decoder.decode(bomb)]
    assert max(pieces) <= decoding.PIECE * 2  # never one huge buffer
    assert sum(pieces) <= 2 * 1024 * 1024
    assert decoder.problem == "decoded body too large; rest not inspected"
    assert list(decoder.decode(b"more")) == []


def test_bomb_ends_a_stream_as_partial(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decoding, "MAX_DECODED", 1024 * 1024)
    sample = STREAMS["anthropic"]
    padding = b": " + b"x" * 2_000_000 + b"\n"
    body = gzip.compress(sample.body[:1200] + padding + sample.body[1200:])
    usage = read(sample, [body], encoding="gzip")
    assert usage.partial
    assert usage.problem == "decoded body too large; rest not inspected"
