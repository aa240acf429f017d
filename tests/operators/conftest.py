"""Fixtures of the operator tools: process settings that a test may change."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tokenfuse.config import Settings, reload


@pytest.fixture
def environment() -> Iterator[Callable[[dict[str, str]], Settings]]:
    """Make the process's settings those of a given ``TOKENFUSE_*`` environment (as if a new
    process started with it); the real environment's settings come back afterwards."""
    yield reload
    reload()
