"""Recording off the caller's path: ``FuseTransport(record="background")``.

The settle step hands the amount to a ``Recorder`` and returns: the response reaches the
caller without waiting on the store. A worker thread takes what is pending, up to
``max_batch`` calls at a time, and records it with ``Fuse.record_batch``: one store round
trip per batch (one script per key on Redis). So a process records tens of thousands of
calls a second, and the calls themselves never wait for a record.

* **Failure-loop notes.** A call's note for the failure-loop breaker (``LoopNote``: its
  send, its failure or success) waits with its usage, or alone for a call with no usage, and
  goes in the same pipeline: one ``NoteLoopBatch`` per identity (``_loops.LoopNotes``). So
  a guarded call with the breaker on costs the caller no round trip at all on ``RedisStore``
  once its open-key view is synced (the check before it is the view's).
* **Trips.** A batch that trips a key (or a call) opens it in the store, and ``RedisStore``
  marks it in its open-key view at once (``MemoryStore`` is the state itself): the next gate
  (or loop check) of this process is refused. A call whose usage or note is still pending when
  the next one is gated is not counted yet; how far behind the worker runs is at most one
  batch.
* **Bounded.** At most ``max_pending`` calls wait. When that many do, or the worker has died,
  the call is recorded (and noted) at once, on the caller's path, as without a recorder: never
  dropped, never blocked on the queue (``counts.inline``; logged at most once a minute).
* **Flushed** on ``close()`` of the transport, and at interpreter exit.
* **Reports.** ``response.extensions["tokenfuse"].record`` is filled in when the batch is
  recorded, with the decision of its key's batch.

The worker is a thread for ``AsyncFuseTransport`` too (its fuse's store needs a sync face,
as ``MemoryStore`` and ``RedisStore.from_url`` have): an asyncio task would end with the event
loop that started it, and the pending records with it.

>>> transport = FuseTransport(fuse=fuse, record="background")   # doctest: +SKIP
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass

from .._errors import ConfigurationError
from .._events import logger
from .._fuse import Fuse
from .._loops import LoopNote, LoopNotes
from .meter import Meter

__all__ = ["Recorder", "RecorderCounts"]

#: What waits: a call's meter and amount to record (None: none), and its loop note (or None).
Pending = tuple[Meter | None, float | None, LoopNote | None]

_LOG_EVERY = 60.0
#: How long ``close()`` waits for the worker to send what is pending.
FLUSH_WAIT = 5.0


@dataclass(slots=True)
class RecorderCounts:
    """What a ``Recorder`` did.

    >>> RecorderCounts().inline
    0
    """

    recorded: int = 0  # calls recorded (or noted) by the worker
    batches: int = 0  # store round trips the worker made
    inline: int = 0  # calls recorded on the caller's path: queue full, or no worker
    failed: int = 0  # batches whose recording raised (a fail_closed fuse with a dead store)


class Recorder:
    """A bounded queue of usage to record, and the worker thread that records it in batches.

    Args:
        fuse: the fuse to record in (its store needs a sync face).
        max_pending: calls that may wait; past that a call is recorded inline.
        max_batch: calls recorded per round trip at most.
    """

    def __init__(self, fuse: Fuse, *, max_pending: int = 10_000, max_batch: int = 1_000) -> None:
        if not fuse.has_sync:
            raise ConfigurationError(
                'record="background" needs a store with a sync face (MemoryStore, '
                "RedisStore.from_url); this one is async-only"
            )
        self.fuse = fuse
        self.max_pending = max_pending
        self.max_batch = max_batch
        self.counts = RecorderCounts()
        self._pending: deque[Pending] = deque()
        self._wake = threading.Event()
        self._closing = False
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._idle = threading.Condition()  # notified when the worker has sent all it had
        self._busy = False
        self._next_warning = 0.0
        _at_exit.add(self)

    def submit(
        self, meter: Meter | None, amount: float | None, note: LoopNote | None = None
    ) -> None:
        """Record ``amount`` for the meter's call (None: nothing to record) and send its loop
        ``note``, later; never blocks, never raises."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            thread = self._start()
        if thread is None or len(self._pending) >= self.max_pending:
            self._inline(meter, amount, note)
            return
        self._pending.append((meter, amount, note))
        if not self._wake.is_set():
            self._wake.set()

    def flush(self, timeout: float = FLUSH_WAIT) -> bool:
        """Wait up to ``timeout`` s until everything submitted so far is recorded."""
        self._wake.set()
        with self._idle:
            return self._idle.wait_for(lambda: not self._pending and not self._busy, timeout)

    def close(self) -> None:
        """Record what is pending (the worker, then inline what it left) and stop."""
        self._closing = True
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(FLUSH_WAIT)
        while self._pending:  # the worker is gone or stuck: record the rest here
            self._inline(*self._pending.popleft(), counted=False)

    # -- the worker -------------------------------------------------------------------------------

    def _running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _start(self) -> threading.Thread | None:
        if self._closing:
            return None
        with self._lock:
            if not self._running():
                thread = threading.Thread(target=self._work, name="tokenfuse-recorder", daemon=True)
                try:
                    thread.start()
                except RuntimeError:  # no thread to be had (interpreter shutting down)
                    return None
                self._thread = thread
        return self._thread

    def _work(self) -> None:
        pending = self._pending
        while True:
            self._wake.wait(1.0)
            self._wake.clear()
            while pending:
                self._busy = True
                batch = [pending.popleft() for _ in range(min(len(pending), self.max_batch))]
                self._send(batch)
                self._busy = False
            with self._idle:
                self._idle.notify_all()
            if self._closing:
                return

    def _send(self, batch: list[Pending]) -> None:
        records = [(meter, amount) for meter, amount, _ in batch if meter and amount is not None]
        notes = LoopNotes([note for _, _, note in batch if note is not None])
        try:
            decisions, noted = self.fuse.record_batch_with(
                [(meter.identity, amount) for meter, amount in records], notes.ops
            )
            notes.decided(noted)
        except Exception as exc:  # only a fail_closed fuse raises: the next gate enforces it
            self.counts.failed += 1
            logger.debug("tokenfuse: recording a batch of usage failed: %r", exc)
            return
        for (meter, _), decision in zip(records, decisions, strict=True):
            meter.report.record = decision
        self.counts.recorded += len(batch)
        self.counts.batches += 1

    def _inline(
        self,
        meter: Meter | None,
        amount: float | None,
        note: LoopNote | None,
        *,
        counted: bool = True,
    ) -> None:
        if counted:
            self.counts.inline += 1
            now = time.monotonic()
            if now >= self._next_warning:
                self._next_warning = now + _LOG_EVERY
                logger.warning(
                    "tokenfuse: the background recorder is %s; recording on the caller's path "
                    "(%d calls so far)",
                    "full" if self._running() else "not running",
                    self.counts.inline,
                )
        try:
            if meter is None or amount is None:
                if note is not None:
                    note.send()
                return
            if note is None:
                meter.report.record = self.fuse.record(meter.identity, amount)
                return
            # the record and the note in one round trip, as an inline transport sends them
            meter.report.record, found = self.fuse.record_with(meter.identity, amount, [note.op])
            note.decided(found[0] if found else None)
        except Exception as exc:  # a fail_closed fuse: the response is paid for already
            logger.debug("tokenfuse: recording usage failed, the call goes on: %r", exc)


# Every recorder, flushed at exit (weak: a recorder lives as long as its transport).
_at_exit: weakref.WeakSet[Recorder] = weakref.WeakSet()


@atexit.register
def _flush_at_exit() -> None:
    for recorder in list(_at_exit):
        recorder.close()
