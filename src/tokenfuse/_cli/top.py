"""``tokenfuse top``: the keys, busiest first, redrawn every few seconds.

On a terminal, a key press re-sorts the table: ``r`` rate, ``m`` multiple of the baseline,
``b`` baseline, ``k`` bucket (emptiest first), ``s`` state (open first); ``q`` quits. Elsewhere
(a pipe) the table is redrawn until interrupted.
"""

from __future__ import annotations

import contextlib
import select
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from .._admin.service import Admin
from .._admin.views import KeyView
from .render import key_table

__all__ = ["frame", "run_top"]

_KEYS = {"r": "rate", "m": "multiple", "b": "baseline", "k": "bucket", "s": "state"}


def frame(views: Sequence[KeyView], sort: str, limit: int) -> Group:
    """One screen: a header line counting every key by state, and the first ``limit`` rows."""
    counts: dict[str, int] = {}
    for view in views:
        counts[view.state] = counts.get(view.state, 0) + 1
    states = ("open", "near", "ok", "idle")
    shown = ", ".join(f"{counts[state]} {state}" for state in states if state in counts)
    header = Text(f"tokenfuse top  {time.strftime('%H:%M:%S')}  ", style="bold")
    header.append(f"{len(views)} keys ({shown or 'none'})  ")
    header.append(f"sorted by {sort}", style="cyan")
    header.append("   r m b k s: sort  q: quit", style="dim")
    return Group(header, key_table(views[:limit]))


@contextlib.contextmanager
def _keypresses() -> Iterator[Any]:
    """Single key presses from a terminal (cbreak mode), or None when stdin is no terminal."""
    if not sys.stdin.isatty():
        yield None
        return
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield sys.stdin
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _wait_for_key(keys: Any, seconds: float) -> str | None:
    if keys is None:
        time.sleep(seconds)
        return None
    ready, _, _ = select.select([keys], [], [], seconds)
    return keys.read(1) if ready else None


def run_top(
    admin: Admin,
    console: Console,
    *,
    sort: str,
    limit: int,
    interval: float,
    fuse: str | None = None,
    frames: int | None = None,
) -> None:
    """Redraw until ``q`` or Ctrl-C (or after ``frames`` redraws)."""
    drawn = 0
    with _keypresses() as keys, Live(console=console, auto_refresh=False) as live:
        try:
            while frames is None or drawn < frames:
                live.update(frame(admin.keys(fuse=fuse, sort=sort), sort, limit), refresh=True)
                drawn += 1
                if frames is not None and drawn >= frames:
                    break
                pressed = _wait_for_key(keys, interval)
                if pressed == "q":
                    break
                sort = _KEYS.get(pressed or "", sort)
        except KeyboardInterrupt:
            pass
    if not console.is_terminal:
        console.line()  # a redrawn screen ends its last line; piped output needs the newline
