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

# This module is the public face of _replay: the names it exports, no more.
from ._replay import *  # noqa: F403
from ._replay import __all__ as __all__
