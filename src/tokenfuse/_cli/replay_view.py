"""How ``tokenfuse replay`` shows a replay: a summary, then per key when and why it tripped."""

from __future__ import annotations

import time

from rich.console import Group
from rich.table import Table
from rich.text import Text

from .._replay import ReplayResult
from .render import number

__all__ = ["replay_report"]

_SHOWN_TRIPS = 3  # per key; --json has them all


def _moment(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(epoch))


def replay_report(result: ReplayResult) -> Group:
    velocity = result.velocity
    keys = result.keys
    start = min((key.first_at for key in keys), default=0.0)
    end = max((key.last_at for key in keys), default=0.0)
    side = "inbound calls" if result.inbound else "outbound tokens"
    summary = Text(
        f"{result.rows:,} rows, {len(keys)} keys, {_moment(start)} to {_moment(end)} UTC "
        f"({side}); {len(result.tripped)} keys would have tripped\n"
    )
    summary.append(
        f"policy: limit {number(velocity.limit, 'none')}/min, spike x{velocity.spike_multiple:g} "
        f"over a baseline of at least {number(velocity.min_baseline)}/min, cold start "
        f"{number(velocity.cold_start_limit, 'off')}/min, learning "
        f"{velocity.learning_period / 86_400:g} d",
        style="dim",
    )
    if result.bucket is not None:
        bucket = result.bucket
        summary.append(f"; bucket {bucket.capacity:g} refilling {bucket.rate:g}/s", style="dim")
    if result.skipped:
        skipped = f"\n{result.skipped} rows skipped, the first: {result.problems[0]}"
        summary.append(skipped, style="yellow")
    table = Table(title="per key, those that would have tripped first", title_justify="left")
    for column in ("key", "calls", "tokens", "trips", "refused calls", "refused tokens"):
        table.add_column(column, justify="left" if column == "key" else "right")
    table.add_column("when and why")
    for key in keys:
        trips = "\n".join(
            f"{_moment(trip.at)}  {trip.reason}: {number(trip.rate)}/min over {number(trip.limit)}"
            + (f" ({trip.multiple:.1f}x baseline {number(trip.baseline)})" if trip.multiple else "")
            for trip in key.trips[:_SHOWN_TRIPS]
        )
        if len(key.trips) > _SHOWN_TRIPS:
            trips += f"\n… and {len(key.trips) - _SHOWN_TRIPS} more"
        label = Text(key.key + " ", style="bold")
        label.append(key.key_id, style="cyan")
        table.add_row(
            label,
            f"{key.calls:,}",
            number(key.tokens),
            str(len(key.trips)),
            f"{key.refused_calls:,}",
            number(key.refused_tokens),
            trips or Text("never", style="green"),
        )
    return Group(summary, table)
