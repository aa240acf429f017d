from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from functools import partial
from typing import Any

import pytest

from tests.conftest import Clock
from tests.middleware.apps import FRAMEWORKS, Call
from tokenfuse import FREE, BucketPolicy, Fuse, MemoryStore, VelocityPolicy
from tokenfuse._middleware import CALL_VELOCITY, inbound_fuse


@pytest.fixture(params=sorted(FRAMEWORKS))
def serve(request: pytest.FixtureRequest) -> Iterator[Callable[..., Call]]:
    """Build the tool API on each framework with the given middleware options."""
    with ExitStack() as stack:
        yield partial(FRAMEWORKS[request.param], stack)


@pytest.fixture
def store(clock: Clock) -> MemoryStore:
    return MemoryStore(clock=clock)


@pytest.fixture
def make_fuse(store: MemoryStore) -> Callable[..., Fuse]:
    def make(
        bucket: BucketPolicy | None = FREE,
        velocity: VelocityPolicy | None = CALL_VELOCITY,
        **options: Any,
    ) -> Fuse:
        return inbound_fuse(store, bucket=bucket, velocity=velocity, **options)

    return make
