"""Every API shape of the reference table, end to end through the transport.

Each case runs through a real ``httpx``/``httpx2`` client (sync and async) with the response
plain or gzip-compressed, and delivered already read, whole, cut at random points, or one byte
per chunk. The client must receive exactly the provider's bytes, and the fuse must have
recorded exactly the provider's total (or nothing, for calls that consume nothing).
"""

from __future__ import annotations

from types import ModuleType

import pytest

from tokenfuse import Fuse
from tokenfuse._transport import AsyncFuseTransport, FuseReport, FuseTransport
from tokenfuse._usage import ExtractorRegistry, ShapeExtractor, UsageShape

from .bodies import CASES, Case
from .conftest import ChunkServer

DELIVERIES = [
    pytest.param(("identity", "read"), id="read"),
    pytest.param(("identity", "whole"), id="whole"),
    pytest.param(("identity", "random"), id="random"),
    pytest.param(("identity", "bytes"), id="bytes"),
    pytest.param(("gzip", "read"), id="gzip-read"),
    pytest.param(("gzip", "random"), id="gzip-random"),
    pytest.param(("gzip", "bytes"), id="gzip-bytes"),
]
SHAPES = [pytest.param(case, id=name) for name, case in CASES.items()]


def serve(lib: ModuleType, case: Case, delivery: tuple[str, str]) -> ChunkServer:
    encoding, how = delivery
    return ChunkServer(lib, case, encoding=encoding, how=how, already_read=how == "read")


def check(case: Case, fuse: Fuse, report: FuseReport, content: bytes) -> None:
    assert content == case.body  # the client got the provider's bytes, decoded as usual
    assert report.done
    usage = report.usage
    assert usage is not None
    status = fuse.status(report.identity)
    if case.total is None:
        assert usage.total is None  # unknown, never a silent 0
        assert usage.problem
        assert report.record is None
        assert status.rate == 0
    elif case.counts_nothing:
        assert usage.counts_nothing
        assert usage.total == 0
        assert report.record is None
        assert status.rate == 0
    else:
        assert usage.total == pytest.approx(case.total)
        assert not usage.partial
        assert not usage.estimated
        assert report.record is not None
        assert report.record.rate == pytest.approx(case.total)
        assert status.rate == pytest.approx(case.total)


@pytest.mark.parametrize("delivery", DELIVERIES)
@pytest.mark.parametrize("case", SHAPES)
def test_sync(lib: ModuleType, fuse: Fuse, case: Case, delivery: tuple[str, str]) -> None:
    server = serve(lib, case, delivery)
    with lib.Client(transport=FuseTransport(server.transport(), fuse=fuse)) as client:
        response = client.request(
            case.method, case.url, headers=case.request_headers, content=b"{}"
        )
    assert response.status_code == case.status
    check(case, fuse, response.extensions["tokenfuse"], response.content)


@pytest.mark.parametrize("delivery", DELIVERIES)
@pytest.mark.parametrize("case", SHAPES)
async def test_async(lib: ModuleType, fuse: Fuse, case: Case, delivery: tuple[str, str]) -> None:
    server = serve(lib, case, delivery)
    async with lib.AsyncClient(
        transport=AsyncFuseTransport(server.transport(), fuse=fuse)
    ) as client:
        response = await client.request(
            case.method, case.url, headers=case.request_headers, content=b"{}"
        )
    assert response.status_code == case.status
    check(case, fuse, response.extensions["tokenfuse"], response.content)


@pytest.mark.parametrize("case", SHAPES)
def test_streamed_by_the_client(lib: ModuleType, fuse: Fuse, case: Case) -> None:
    """``client.stream()``: the usage is settled when the client has read the last chunk."""
    server = serve(lib, case, ("gzip", "random"))
    with (
        lib.Client(transport=FuseTransport(server.transport(), fuse=fuse)) as client,
        client.stream(case.method, case.url, headers=case.request_headers) as response,
    ):
        report: FuseReport = response.extensions["tokenfuse"]
        assert not report.done  # returned before the body was read
        content = b"".join(response.iter_bytes())
        assert report.done
    check(case, fuse, report, content)


def test_an_unknown_host_falls_back_to_the_generic_reader(lib: ModuleType, fuse: Fuse) -> None:
    case = Case(
        "https://llm.internal.example/generate",
        "application/json",
        b'{"text": "hi", "usage": {"input_tokens": 7, "output_tokens": 5}}',
        12,
    )
    server = serve(lib, case, ("gzip", "random"))
    with lib.Client(transport=FuseTransport(server.transport(), fuse=fuse)) as client:
        response = client.post(case.url)
    check(case, fuse, response.extensions["tokenfuse"], response.content)


def test_a_registered_extractor_counts_a_custom_shape(lib: ModuleType, fuse: Fuse) -> None:
    registry = ExtractorRegistry()
    shape = UsageShape(containers=(("meta", "tokens"),), input=("in",), output=("out",))
    registry.register(ShapeExtractor(shape, provider="acme", host="llm.acme.internal"))
    case = Case(
        "https://llm.acme.internal/v3/complete",
        "application/x-ndjson",
        b'{"delta": "a"}\n{"delta": "b", "meta": {"tokens": {"in": 12, "out": 30}}}\n',
        42,
    )
    server = serve(lib, case, ("identity", "bytes"))
    transport = FuseTransport(server.transport(), fuse=fuse, registry=registry)
    with lib.Client(transport=transport) as client:
        response = client.post(case.url)
    check(case, fuse, response.extensions["tokenfuse"], response.content)
    assert response.extensions["tokenfuse"].usage.provider == "acme"
