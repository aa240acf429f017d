"""How the CLI shows things to a person: ``rich`` tables and lines (``--json`` skips all this).

Numbers are written short (``12.3k``), times relative (``in 42 s``), and a key is always its
label with its key id next to it, the id being what an operator types back.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.console import Group
from rich.table import Table
from rich.text import Text

from .._admin.views import KeyView
from .._events import FuseEvent

__all__ = ["event_line", "key_detail", "key_table", "number", "when"]

_STATE_STYLE = {"open": "bold red", "near": "yellow", "ok": "green", "idle": "dim"}
_EVENT_STYLE = {"tripped": "bold red", "near_limit": "yellow", "store_unavailable": "red"}


def number(value: float | None, empty: str = "—") -> str:
    """``1234567`` -> ``1.2M``; ``None`` -> ``—``."""
    if value is None:
        return empty
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:.1f}{suffix}"
    return f"{value:.0f}" if value == int(value) or abs(value) >= 10 else f"{value:.1f}"


def when(epoch: float | None, now: float | None = None, empty: str = "—") -> str:
    """``in 42 s`` / ``3 min ago`` from epoch seconds."""
    if epoch is None:
        return empty
    delta = epoch - (time.time() if now is None else now)
    size = abs(delta)
    text = (
        f"{size:.0f} s"
        if size < 120
        else f"{size / 60:.0f} min"
        if size < 7_200
        else f"{size / 3_600:.1f} h"
        if size < 172_800
        else f"{size / 86_400:.1f} d"
    )
    return f"in {text}" if delta >= 0 else f"{text} ago"


def _key(view: KeyView) -> Text:
    text = Text(view.label or "", style="bold")
    if view.label:
        text.append(" ")
    text.append(view.key_id, style="cyan")
    return text


def _multiple(view: KeyView) -> str:
    multiple = view.multiple
    return "—" if multiple is None else f"{multiple:.1f}x"


def _baseline(view: KeyView) -> str:
    status = view.status
    if status.baseline is not None:
        return number(status.baseline)
    if status.samples:
        return f"({number(status.learned_baseline)})"  # still learning: not used yet
    return "—"


def _bucket(view: KeyView) -> str:
    fill = view.bucket_fill
    status = view.status
    if fill is None:
        return "—"
    level = status.bucket_capacity if status.bucket_level is None else status.bucket_level
    return f"{number(level)}/{number(status.bucket_capacity)} {fill:4.0%}"


def key_table(
    views: Sequence[KeyView], *, title: str | None = None, now: float | None = None
) -> Table:
    """One row per key: key, fuse, state, rate, baseline, multiple, threshold, bucket, opens."""
    table = Table(title=title, title_justify="left", expand=False, pad_edge=False)
    table.add_column("key (label  id)", no_wrap=True)
    table.add_column("fuse")
    table.add_column("state")
    table.add_column("rate/min", justify="right")
    table.add_column("baseline", justify="right")
    table.add_column("multiple", justify="right")
    table.add_column("threshold", justify="right")
    table.add_column("bucket", justify="right")
    table.add_column("closes", justify="right")
    for view in views:
        table.add_row(
            _key(view),
            view.fuse,
            Text(view.state, style=_STATE_STYLE[view.state]),
            number(view.status.rate),
            _baseline(view),
            _multiple(view),
            number(view.threshold),
            _bucket(view),
            when(view.status.open_until, now, empty=""),
        )
    return table


def key_detail(view: KeyView, now: float | None = None) -> Group:
    """Everything known about one key of one fuse, a line per fact."""
    status = view.status
    unit = view.unit
    rows = Table.grid(padding=(0, 2))
    rows.add_column(style="dim")
    rows.add_column()
    facts: list[tuple[str, str | Text]] = [
        ("state", Text(view.state, style=_STATE_STYLE[view.state])),
        ("rate", f"{number(status.rate)} {unit}/min over the last 60 s"),
        ("baseline", _baseline_detail(view)),
        ("multiple", _multiple(view)),
        ("threshold", f"{number(view.threshold)} {unit}/min (what trips it now)"),
        ("manual ceiling", number(status.limit, "none")),
        ("open until", when(status.open_until, now, empty="closed")),
        (
            "bucket",
            _bucket(view)
            + (f" refilling {number(status.bucket_rate)}/s" if status.bucket_rate else ""),
        ),
        ("first seen", when(status.first_seen, now)),
    ]
    for name, value in facts:
        rows.add_row(name, value)
    header = _key(view)
    header.append(f"  fuse {view.fuse}", style="dim")
    return Group(header, rows)


def _refill(rate: float | None) -> str:
    return "" if rate is None else f" refilling {number(rate)}/s"


def _baseline_detail(view: KeyView) -> str:
    status = view.status
    if status.baseline is not None:
        return f"{number(status.baseline)} {view.unit}/min, established ({status.samples} minutes)"
    return (
        f"learning: {number(status.learned_baseline)} {view.unit}/min from {status.samples} "
        "active minutes (not used until established)"
    )


def event_line(event: FuseEvent) -> Text:
    """``12:03:04 tripped  agent-7 3f9a0c1b2d4e  <detail>``."""
    text = Text(time.strftime("%H:%M:%S ", time.localtime(event.at)), style="dim")
    text.append(f"{event.kind:<17}", style=_EVENT_STYLE.get(event.kind, "bold"))
    if event.key_id is not None:
        text.append(f"{event.key_id} ", style="cyan")
    if event.fuse is not None:
        text.append(f"[{event.fuse}] ", style="dim")
    text.append(event.detail)
    return text
