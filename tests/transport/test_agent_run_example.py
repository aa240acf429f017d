"""The agent-run example runs as it is: its subagents share one budget and stay within it, and
the one stuck in a failing tool loop is stopped by the failure-loop breaker."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).parents[2] / "examples" / "agent_run.py"


def test_the_agent_run_example_stops_its_subagents_within_the_budget() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=60, check=True
    )
    out = result.stdout
    assert "stopped by the run budget: run budget exceeded for run 'report-42'" in out
    assert "budget_near: run 'report-42'" in out
    spent = re.search(r"run 'report-42' spent ([\d,]+) tokens and \$([\d.]+)", out)
    assert spent is not None
    assert 30_000 < float(spent.group(1).replace(",", "")) <= 40_000
    assert float(spent.group(2)) <= 0.30
    assert "within budget: True" in out
    # the stuck subagent: three failing tool calls answered, the fourth request refused
    fixer = "fixer: 3 of 20 calls made, stopped by the failure-loop breaker: tool-call loop"
    assert fixer in out
