"""Alerts: send the events an operator pages on (trips, near-limit episodes) to a webhook.

Logging stays the default sink: every event is already logged on
``logging.getLogger("tokenfuse")``. A ``WebhookSink`` adds a JSON ``POST`` per event, made
off the hot path: the guarded call only puts the event in a bounded queue, and one background
thread sends it, retrying with back-off. When the queue is full the event is dropped, counted
(``dropped``) and logged (at most once a minute), never waited for.

::

    from tokenfuse import Fuse
    from tokenfuse.alerts import WebhookSink
    from tokenfuse.events import listen

    sink = WebhookSink("https://hooks.example.com/tokenfuse")
    fuse = Fuse(on_event=sink)      # the events of one fuse, or
    listen(sink)                    # of every fuse in the process

``TOKENFUSE_ALERT_WEBHOOK=https://...`` does the second with no code.

The body is one JSON object (``payload``): ``kind``, ``key`` (the redacted label), ``key_id``,
``fuse``, ``detail``, ``at`` (epoch seconds), the refusal's numbers for a trip (``reason``,
``rate``, ``limit``, ``baseline``, ``multiple``, ``retry_after``, ``unit``), and ``text``, a
one-line summary that chat webhooks (Slack, Mattermost) display as the message.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from ._events import FuseEvent

__all__ = ["ALERT_KINDS", "WebhookSink", "payload"]

logger = logging.getLogger("tokenfuse.alerts")

#: The events a sink sends unless told otherwise.
ALERT_KINDS = frozenset({"tripped", "near_limit", "failure_loop", "budget_near", "budget_exceeded"})

_RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})


def payload(event: FuseEvent) -> dict[str, object]:
    """The JSON object a sink sends for ``event``: no raw credential, only labels and ids.

    >>> payload(FuseEvent("near_limit", "agent-7", "over 80 % for 5 min"))["text"]
    'tokenfuse near_limit: over 80 % for 5 min'
    """
    body: dict[str, object] = {
        "kind": event.kind,
        "key": event.key,
        "key_id": getattr(event, "key_id", None),
        "fuse": getattr(event, "fuse", None),
        "detail": event.detail,
        "at": event.at,
        "text": f"tokenfuse {event.kind}: {event.detail}",
    }
    error = event.error
    if error is not None:
        body.update(
            reason=error.reason,
            rate=error.rate,
            limit=error.limit,
            baseline=error.baseline,
            multiple=error.multiple,
            retry_after=error.retry_after,
            unit=error.unit,
        )
    return body


@dataclass(frozen=True, slots=True)
class _Sent:
    status: int | None  # None: no answer (connection error, timeout)
    problem: str | None


def _post(url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> _Sent:
    request = urllib.request.Request(url, data=body, headers=dict(headers), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return _Sent(int(answer.status), None)
    except urllib.error.HTTPError as exc:
        return _Sent(exc.code, f"HTTP {exc.code}")
    except (OSError, ValueError) as exc:  # URLError, timeouts, refused connections
        return _Sent(None, f"{type(exc).__name__}: {exc}")


class WebhookSink:
    """An event hook that POSTs events as JSON from a background thread, with retries.

    Args:
        url: where to send (``http://`` or ``https://``).
        kinds: the event kinds to send (default ``ALERT_KINDS``: trips and near-limit episodes).
        headers: extra request headers (an ``Authorization`` for the receiver, say).
        timeout: seconds one attempt may take.
        retries: further attempts after a failed one (connection errors, 408/425/429/5xx); other
            answers are final.
        backoff: seconds before the first retry, doubling for each further one.
        max_queue: events waiting to be sent at most; past it new events are dropped.
        wait: how the sender waits between attempts (``threading.Event.wait``-like: returns
            True to stop early); tests inject one that does not sleep.

    ``sent``, ``failed`` (given up after the retries) and ``dropped`` (queue full) count
    events. ``close()`` sends what is queued (up to its timeout) and stops the thread.
    """

    def __init__(
        self,
        url: str,
        *,
        kinds: Collection[str] = ALERT_KINDS,
        headers: Mapping[str, str] | None = None,
        timeout: float = 5.0,
        retries: int = 3,
        backoff: float = 0.5,
        max_queue: int = 1_000,
        wait: Callable[[float], bool] | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"webhook url must be http:// or https://, not {url[:40]!r}")
        self.url = url
        self.kinds = frozenset(kinds)
        self.headers = {"Content-Type": "application/json", **(headers or {})}
        self.timeout = float(timeout)
        self.retries = max(int(retries), 0)
        self.backoff = float(backoff)
        self.sent = self.failed = self.dropped = 0
        self._queue: queue.Queue[FuseEvent | None] = queue.Queue(maxsize=max_queue)
        self._stopping = threading.Event()
        self._wait = wait or self._stopping.wait
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._next_drop_log = 0.0

    def __repr__(self) -> str:
        # The URL may carry a token (chat webhooks do): show its host only.
        host = self.url.split("://", 1)[1].split("/", 1)[0].rpartition("@")[2]
        return f"WebhookSink({host!r}, sent={self.sent}, failed={self.failed})"

    def __call__(self, event: FuseEvent) -> None:
        """Queue ``event`` if it is one to send; never blocks, never raises."""
        if event.kind not in self.kinds or self._stopping.is_set():
            return
        self._ensure_thread()
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self.dropped += 1
            now = time.monotonic()
            if now >= self._next_drop_log:
                self._next_drop_log = now + 60.0
                logger.warning(
                    "tokenfuse webhook queue is full: %d alert(s) dropped so far", self.dropped
                )

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued, waiting at most ``timeout`` seconds, then stop the thread."""
        thread = self._thread
        if thread is None:
            self._stopping.set()
            return
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=timeout)  # after every queued event
        thread.join(timeout)
        self._stopping.set()

    def _ensure_thread(self) -> None:
        if self._thread is None:
            with self._start_lock:
                if self._thread is None:
                    thread = threading.Thread(
                        target=self._run, name="tokenfuse-webhook", daemon=True
                    )
                    thread.start()
                    self._thread = thread

    def _run(self) -> None:
        while True:
            event = self._queue.get()
            if event is None:
                return
            try:
                self._deliver(event)
            except Exception:  # never let one bad event stop the sender
                logger.exception("tokenfuse webhook: sending an alert failed")
                self.failed += 1

    def _deliver(self, event: FuseEvent) -> None:
        body = json.dumps(payload(event), allow_nan=False, default=str).encode()
        delay = self.backoff
        for attempt in range(self.retries + 1):
            sent = _post(self.url, body, self.headers, self.timeout)
            if sent.problem is None:
                self.sent += 1
                return
            final = sent.status is not None and sent.status not in _RETRY_STATUSES
            if final or attempt == self.retries or self._wait(delay):
                break
            delay *= 2
        self.failed += 1
        logger.warning(
            "tokenfuse webhook: could not deliver a %s alert for %s (%s)",
            event.kind,
            event.key,
            sent.problem,
        )
