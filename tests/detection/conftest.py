"""Replays of the detection scenarios (``benchmarks/detection_scenarios.py``) on a simulated
clock, and the store backends of ``tests/stores`` for the operations detection adds."""

from __future__ import annotations

from tests.stores.conftest import backend

__all__ = ["backend"]
