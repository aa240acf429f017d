"""Fixtures of the transport tests: both HTTP libraries, fuses on the simulated clock, and
inner transports that serve a response whole, already read, or as a stream of chunks."""

from __future__ import annotations

import gzip
import random
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import httpx
import httpx2
import pytest

from tests.conftest import Clock
from tokenfuse import Fuse, Identity, MemoryStore, VelocityPolicy

from .bodies import Case
from .llm_server import LLMServer

LIBRARIES = [pytest.param(httpx, id="httpx"), pytest.param(httpx2, id="httpx2")]


@pytest.fixture(params=LIBRARIES)
def lib(request: pytest.FixtureRequest) -> ModuleType:
    module: ModuleType = request.param
    return module


@pytest.fixture(scope="module")
def llm_server() -> Iterator[LLMServer]:
    """The stub OpenAI-compatible server on loopback, one per test module."""
    with LLMServer() as running:
        yield running


@pytest.fixture
def api_key() -> str:
    """An API key of the test's own, so that tests sharing a fuse stay apart."""
    return f"sk-test-{uuid.uuid4().hex}"


@pytest.fixture
def fuse(clock: Clock) -> Fuse:
    """A fresh fuse on the embedded store and the simulated clock, default policy."""
    return Fuse(MemoryStore(clock=clock))


# A policy whose baseline arms within minutes, so a loop trips as LoopSuspected in a test.
QUICK = VelocityPolicy(learning_period=0, min_samples=3, min_baseline=100)


def trained_fuse(clock: Clock, *keys: str | Identity, per_minute: float = 1_000) -> Fuse:
    """A fuse whose ``keys`` have an established baseline of ``per_minute`` tokens."""
    fuse = Fuse(MemoryStore(clock=clock), velocity=QUICK)
    for _ in range(6):
        for key in keys:
            fuse.record(key, per_minute)
        clock.advance(60)
    for key in keys:
        assert fuse.status(key).established, fuse.status(key)
    return fuse


def split(body: bytes, how: str, seed: int = 0) -> list[bytes]:
    """Cut a body into the chunks a network might deliver."""
    if how == "whole":
        return [body]
    if how == "bytes":
        return [body[i : i + 1] for i in range(len(body))]
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(body)), min(len(body) - 1, 12)))
    return [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]


def encode(body: bytes, encoding: str) -> bytes:
    return gzip.compress(body) if encoding == "gzip" else body


@dataclass
class ChunkServer:
    """An inner transport's handler: serves one case, counts the requests that reached it."""

    lib: ModuleType
    case: Case
    encoding: str = "identity"
    how: str = "whole"
    already_read: bool = False
    requests: list[Any] = field(default_factory=list)
    closed: list[bool] = field(default_factory=list)

    def __call__(self, request: Any) -> Any:
        self.requests.append(request)
        headers = {"content-type": self.case.content_type, **self.case.response_headers}
        body = encode(self.case.body, self.encoding)
        if self.encoding != "identity":
            headers["content-encoding"] = self.encoding
        if self.already_read:
            return self.lib.Response(self.case.status, headers=headers, content=body)
        stream = chunk_stream(self.lib, split(body, self.how), self.closed)
        return self.lib.Response(self.case.status, headers=headers, stream=stream)

    def transport(self) -> Any:
        return self.lib.MockTransport(self)


def chunk_stream(lib: ModuleType, chunks: list[bytes], closed: list[bool] | None = None) -> Any:
    """A not-yet-read response stream of ``lib`` (sync and async) yielding ``chunks``."""

    class Chunks(lib.SyncByteStream, lib.AsyncByteStream):  # type: ignore[name-defined,misc]
        def __iter__(self) -> Iterator[bytes]:
            yield from chunks

        async def __aiter__(self) -> AsyncIterator[bytes]:
            for chunk in chunks:
                yield chunk

        def close(self) -> None:
            if closed is not None:
                closed.append(True)

        async def aclose(self) -> None:
            self.close()

    return Chunks()


Handler = Callable[[Any], Any]
