"""The runaway-agent example runs as it is and shows the loop stopped."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).parents[2] / "examples" / "runaway_agent.py"


def test_the_runaway_agent_example_is_stopped_with_loop_suspected() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=60, check=True
    )
    out = result.stdout
    assert "learned baseline for key sk-…7f3a" in out
    assert "LoopSuspected: possible agent loop or retry storm" in out
    assert "requests that reached the LLM: 0" in out
    assert "sk-proj-demo-agent-7f3a" not in out + result.stderr  # the raw key is never shown
