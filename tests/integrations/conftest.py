"""Fixtures of the framework tests: one stub LLM server on loopback, a fresh fuse per test.

Every framework here is the real package, talking HTTP to ``AgentServer`` on 127.0.0.1. The
fuse has the default policy: its cold-start ceiling (100,000 tokens/min without the
largest call) trips on the third 60,000-token call, so a runaway agent is refused on its
fourth call, and three requests reach the server.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from tokenfuse import Fuse, MemoryStore

from .stub import AgentServer

# LiteLLM fetches its model price list from the internet on import unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

#: Requests that reach the server before a 60,000-token loop is refused.
UNTIL_TRIP = 3


@pytest.fixture(scope="session")
def server() -> Iterator[AgentServer]:
    with AgentServer() as running:
        yield running


@pytest.fixture
def fuse() -> Fuse:
    """A fresh fuse on the embedded store, with the default policy."""
    return Fuse(MemoryStore())


@pytest.fixture
def api_key() -> str:
    """A credential of this test alone: the server counts requests per credential."""
    return f"sk-test-{uuid.uuid4().hex[:12]}"
