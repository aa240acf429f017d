"""What watches a process's fuses without code: installed from the settings at first use.

``apply(settings)`` runs whenever a ``Fuse`` is built: it installs, once, the observers the
settings ask for (``TOKENFUSE_ALERT_WEBHOOK``: a ``WebhookSink`` listening to every fuse), and
swaps them when ``tokenfuse.configure`` changed what they depend on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ._settings import Settings

__all__ = ["apply"]

_lock = threading.Lock()
_applied: Settings | None = None
_webhook: tuple[str, Callable[[], None], Callable[[], None]] | None = None  # url, stop, close


def apply(settings: Settings) -> None:
    """Install what ``settings`` ask for, unless these very settings were applied already."""
    global _applied
    if settings is _applied:
        return
    with _lock:
        if settings is _applied:
            return
        _apply_webhook(settings.alert_webhook)
        _applied = settings


def _apply_webhook(url: str | None) -> None:
    global _webhook
    if _webhook is not None and _webhook[0] == url:
        return
    if _webhook is not None:
        _, stop, close = _webhook
        stop()
        close()
        _webhook = None
    if url is None:
        return
    from ._alerts import WebhookSink
    from ._events import listen

    sink = WebhookSink(url)
    _webhook = (url, listen(sink), sink.close)
