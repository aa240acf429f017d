"""examples/mcp_server runs as its README says: the server under uvicorn, the agent against it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.middleware.servers import ROOT, child_env, free_port, running

pytestmark = pytest.mark.slow


def test_the_runaway_agent_is_stopped_and_its_session_goes_on() -> None:
    port = free_port()
    env = {"PORT": str(port), "PYTHONPATH": str(ROOT / "src")}
    with running(["examples/mcp_server/server.py"], port, env):
        done = subprocess.run(
            [sys.executable, "examples/mcp_server/agent.py",
             "--url", f"http://127.0.0.1:{port}/mcp"],
            cwd=ROOT, capture_output=True, text=True, timeout=120, check=True,
            env=child_env({"PYTHONPATH": str(ROOT / "src")}),
        )  # fmt: skip

    lines = done.stdout.splitlines()
    assert "  summary: 3 x tool error, 2 x refused" in lines
    assert any("failure loop: 'refund' failed 3 times" in line for line in lines)
    assert any("refused: tool 'refund' was not run: call quota exhausted" in line for line in lines)
    assert lines[-2].startswith("  call   1 -> ok: order A-1001: delivered, refunded so far")
