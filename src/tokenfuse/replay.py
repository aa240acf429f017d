"""Replay: try a policy on recorded usage before enforcing it.

::

    from tokenfuse.config import Settings
    from tokenfuse.replay import replay_file

    result = replay_file("usage.csv", Settings(limit=50_000, spike_multiple=8))
    for key in result.tripped:
        print(key.key, key.key_id, [(trip.at, trip.reason) for trip in key.trips])

The rows (timestamp, key, tokens; CSV or JSON lines) go through the guards' own policy core on
a simulated clock. ``tokenfuse replay usage.csv --policy limit=50k/min`` prints the same.
"""

from ._replay import KeyReplay, ReplayResult, Trip, UsageRow, read_usage, replay, replay_file

__all__ = [
    "KeyReplay",
    "ReplayResult",
    "Trip",
    "UsageRow",
    "read_usage",
    "replay",
    "replay_file",
]
