"""Real MCP servers and real MCP clients of both SDK majors.

mcp 2.x lives in the test venv (the ``[test]`` extra). mcp 1.x cannot share it (the majors
pin different ``httpx`` generations), so it lives in a second venv whose interpreter is named
by ``TOKENFUSE_MCP1_PYTHON``: ``.ci/run`` creates it with ``scripts/mcp1-venv.sh``, and so can
a developer. Without it the 1.x cases are skipped locally and fail under CI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.middleware.servers import ROOT, free_port, running

SERVER = "tests/mcp_mode/tool_server.py"
DRIVER = "tests/mcp_mode/drive.py"
#: The bucket of the test servers: 122 units, refilling so slowly that no test sees a refill.
CAPACITY = 122
RATE = 0.001


def mcp1_interpreter() -> str:
    python = os.environ.get("TOKENFUSE_MCP1_PYTHON", "")
    if python and Path(python).exists():
        return python
    if os.environ.get("CI"):
        pytest.fail("TOKENFUSE_MCP1_PYTHON names no interpreter; .ci/run should create it")
    pytest.skip("no mcp 1.x venv (TOKENFUSE_MCP1_PYTHON; see scripts/mcp1-venv.sh)")


@dataclass
class McpServer:
    url: str
    root: str

    def stats(self) -> dict[str, int]:
        with urllib.request.urlopen(f"{self.root}/stats", timeout=10) as response:
            return dict(json.loads(response.read()))


def _serve(python: str) -> Iterator[McpServer]:
    port = free_port()
    env = {
        "PYTHONPATH": str(ROOT / "src"),
        "SERVER_CAPACITY": str(CAPACITY),
        "SERVER_RATE": str(RATE),
    }
    with running([SERVER, str(port)], port, env, python=python):
        root = f"http://127.0.0.1:{port}"
        yield McpServer(f"{root}/mcp", root)


@pytest.fixture(scope="module")
def server_v2() -> Iterator[McpServer]:
    """The server on mcp 2.x (``MCPServer``), in this venv."""
    yield from _serve(sys.executable)


@pytest.fixture(scope="module")
def server_v1() -> Iterator[McpServer]:
    """The server on mcp 1.x (``FastMCP``), in the second venv."""
    yield from _serve(mcp1_interpreter())


#: The clients: (interpreter, mode). 2.x speaks the handshake wire ("legacy") or, with "auto",
#: the 2026-07-28 per-request wire; 1.x speaks the handshake wire.
#: v1 first: without its venv the test is skipped before any driver process has started.
CLIENTS = ["v1", "v2-legacy", "v2-auto"]


def start(client: str, url: str, *args: str) -> tuple[str, subprocess.Popen[str]]:
    """Start the driver with the client's SDK; a fresh caller key unless one is given."""
    python = mcp1_interpreter() if client == "v1" else sys.executable
    mode = "auto" if client == "v2-auto" else "legacy"
    if "--key" not in args:
        args = (*args, "--key", f"sk-test-{uuid.uuid4().hex}")
    process = subprocess.Popen(
        [python, DRIVER, url, *args, "--mode", mode],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )  # fmt: skip
    return client, process


def finish(started: tuple[str, subprocess.Popen[str]]) -> dict[str, Any]:
    """The driver's report (it stops by itself; killed, by its PID, only past the timeout)."""
    client, process = started
    try:
        stdout, stderr = process.communicate(timeout=240)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
    assert process.returncode == 0, stderr
    result: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    assert result["major"] == (1 if client == "v1" else 2)
    return result


def drive(client: str, url: str, *args: str) -> dict[str, Any]:
    return finish(start(client, url, *args))
