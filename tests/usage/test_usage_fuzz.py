"""Nothing escapes feed/finish: arbitrary bytes, chunkings and mutations into every reader."""

from __future__ import annotations

import math
from itertools import pairwise

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenfuse._usage import Usage
from tokenfuse._usage.readers import INTERNAL_ERROR

from .samples import BODIES, EVENTSTREAM, JSON, NDJSON, SSE, STREAMS, compress, reader_for

SAMPLES = [*BODIES.values(), *STREAMS.values()]
_ROUTES = (
    {(s.url, s.content_type) for s in SAMPLES}
    | {("https://llm-gateway.internal/v1/x", ct) for ct in (JSON, SSE, NDJSON, EVENTSTREAM)}
    | {(STREAMS["anthropic"].url, ct) for ct in ("text/plain", None)}  # sniffed
)
ROUTES = sorted(_ROUTES, key=str)  # a stable order, so that hypothesis can replay examples
CODINGS = ["identity", "gzip", "deflate", "raw-deflate", "br"]
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check(usage: Usage) -> None:
    assert isinstance(usage, Usage)
    assert usage.problem != INTERNAL_ERROR  # a bug we caught is still a bug
    if usage.total is None:
        assert usage.problem
    else:
        assert math.isfinite(usage.total)
        assert usage.total >= 0
    if usage.counts_nothing:
        assert usage.total == 0


def run(
    route: tuple[str, str | None],
    chunks: list[bytes],
    *,
    encoding: str | None = None,
    status: int = 200,
    estimate: bool = False,
    complete: bool = True,
) -> None:
    url, content_type = route
    reader = reader_for(url, content_type, encoding=encoding, status=status, estimate=estimate)
    if reader is None:
        return
    for chunk in chunks:
        reader.feed(chunk)
    check(reader.finish(complete=complete))


def chunked(body: bytes, cuts: list[int]) -> list[bytes]:
    bounds = sorted({0, len(body), *(c % (len(body) + 1) for c in cuts)})
    return [body[a:b] for a, b in pairwise(bounds)]


@FUZZ
@given(
    route=st.sampled_from(ROUTES),
    chunks=st.lists(st.binary(max_size=300), max_size=8),
    encoding=st.sampled_from([None, "gzip", "deflate", "br", "gzip, br", "zstd", "bogus"]),
    status=st.sampled_from([200, 200, 206, 404, 500]),
    estimate=st.booleans(),
    complete=st.booleans(),
)
def test_arbitrary_bytes(
    route: tuple[str, str | None],
    chunks: list[bytes],
    encoding: str | None,
    status: int,
    estimate: bool,
    complete: bool,
) -> None:
    run(route, chunks, encoding=encoding, status=status, estimate=estimate, complete=complete)


def mutate(data: st.DataObject, body: bytes) -> bytes:
    out = bytearray(body)
    for _ in range(data.draw(st.integers(0, 6))):
        kind = data.draw(st.sampled_from(["flip", "insert", "delete", "truncate", "dup"]))
        at = data.draw(st.integers(0, max(len(out) - 1, 0)))
        if kind == "flip" and out:
            out[at] = data.draw(st.sampled_from([0, 10, 13, 34, 58, 92, 123, 125, 0xFF, 0xE2]))
        elif kind == "insert":
            out[at:at] = data.draw(
                st.sampled_from(
                    [
                        b"\r",
                        b"\n\n",
                        b"data: ",
                        b":",
                        b'"usage": ',
                        b"[DONE]",
                        b"\xe2\x80\xa8",
                        b'{"total_tokens": 1e400}',
                        b"event: error\n",
                        b'"done":true',
                        b"NaN",
                        b"-7",
                    ]
                )
            )
        elif kind == "delete":
            del out[at : at + data.draw(st.integers(1, 40))]
        elif kind == "truncate":
            del out[at:]
        else:
            out[at:at] = out[at : at + data.draw(st.integers(1, 200))]
    return bytes(out)


@FUZZ
@given(data=st.data())
def test_mutated_valid_streams(data: st.DataObject) -> None:
    sample = data.draw(st.sampled_from(SAMPLES))
    coding = data.draw(st.sampled_from(CODINGS))
    body = mutate(data, sample.body)
    if data.draw(st.booleans()):
        raw = compress(body, coding)
    else:  # corrupt the compressed bytes instead
        raw = mutate(data, compress(sample.body, coding))
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=12))
    route = data.draw(st.sampled_from([(sample.url, sample.content_type), *ROUTES]))
    run(
        route,
        chunked(raw, cuts),
        encoding=None if coding == "identity" else coding.removeprefix("raw-"),
        estimate=data.draw(st.booleans()),
        complete=data.draw(st.booleans()),
    )
