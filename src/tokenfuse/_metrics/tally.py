"""``Tally``: the process's counts of decisions and tokens, kept cheaply for exporters to read.

A guarded call only adds to plain dictionaries under one lock (no metrics library on the hot
path, no I/O, no store round trip); ``prometheus.TallyCollector`` turns them into metrics when
they are scraped. Every label set is bounded: layers, fuses, operations, outcomes and reasons
are few; models are capped (``MAX_MODELS``, the rest are ``other``); keys get series of their own
only when allow-listed or among the ``top`` busiest (``busiest``), from a bounded table.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._identity import KEY_ID_LENGTH
from .._observe import CallFacts

if TYPE_CHECKING:
    from .._fuse import Decision, Fuse
    from .._identity import Identity
    from .._stores.ops import Op
    from .._usage import Usage

__all__ = ["LATENCY_BUCKETS", "MAX_MODELS", "KeySeen", "Tally"]

#: Upper bounds (seconds) of the decision-latency histogram: from an in-process decision
#: (~10 µs) to a Redis round trip on a slow network.
LATENCY_BUCKETS = (
    0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5,
    0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
)  # fmt: skip
_SLOTS = len(LATENCY_BUCKETS) + 1  # the last counts what is over every bound (+Inf)
#: Distinct model names counted by name; later ones are counted as ``other``.
MAX_MODELS = 200
#: Keys remembered for per-key series (the busiest are chosen from these).
_MAX_KEYS = 10_000
_MAX_OPEN = 10_000
#: A key not decided on for this long is no longer among the busiest.
_RECENT = 300.0


@dataclass(slots=True)
class KeySeen:
    """The latest decision about one key, for per-key series."""

    fuse: str
    key_id: str
    label: str
    rate: float
    threshold: float | None
    baseline: float | None
    seen: float  # time.monotonic() of that decision


#: The failure-loop breaker's steps: their decision's ``rate`` and ``limit`` are one call's
#: count and the failures that trip it, which must not stand for the key's rate (inbound,
#: the check comes after the admission of the same key, and would hide its rate).
_LOOP_OPS = frozenset({"check_loops", "note_loop"})
_INBOUND = frozenset({"admit", "lease"})  # lease: the middleware's lease mode renewing
_KEY_STAYS_CLOSED = frozenset({"quota_exhausted", "failure_loop", "repeat_loop", "tool_loop"})


def _layer(fuse: Fuse, op_name: str) -> str:
    # The middleware decides with admit; its fuses have a bucket, even for the tokens a
    # handler reports later (record). The transport gates and records on bucketless fuses.
    return "inbound" if op_name in _INBOUND or fuse.bucket is not None else "outbound"


class _Series:
    """The counts of one operation of one fuse: what a decision adds to, found with one lookup."""

    __slots__ = ("allowed", "degraded", "fuse", "latency", "layer", "op", "refused", "total")

    def __init__(self, layer: str, fuse: str, op: str) -> None:
        self.layer, self.fuse, self.op = layer, fuse, op
        self.allowed = self.refused = self.degraded = 0
        self.latency = [0] * _SLOTS
        self.total = 0.0  # seconds, summed


class Tally:
    """Counts for metrics: an observer of every decision and of outbound usage.

    >>> tally = Tally()
    >>> tally.snapshot()["decisions"]
    {}

    ``keys``: key ids or labels that always get per-key series; ``top``: how many of the
    busiest other keys do.
    """

    def __init__(self, keys: Collection[str] = (), top: int = 10) -> None:
        self._lock = threading.Lock()
        self.keys = frozenset(keys)
        self.top = top
        self._series: dict[tuple[str, str], _Series] = {}  # (fuse, operation)
        #: (provider, model, token type, estimated) -> tokens
        self._tokens: dict[tuple[str, str, str, str], float] = {}
        #: (layer, fuse, reason) -> refused decisions / trips
        self._refusals: dict[tuple[str, str, str], int] = {}
        self._trips: dict[tuple[str, str, str], int] = {}
        self._store_errors: dict[tuple[str, str], int] = {}  # (fuse, operation)
        self._near_limit: dict[str, int] = {}  # fuse -> episodes begun
        self._open: dict[str, float] = {}  # store key -> closes (epoch seconds)
        # store key -> (fuse, label, rate, threshold, baseline, monotonic time of the decision)
        self._seen: dict[str, tuple[str, str, float, float | None, float | None, float]] = {}
        self._models: set[str] = set()

    # -- the observer: what a decision or a call adds, under one lock -------------------------

    def decided(self, fuse: Fuse, op: Op[Any], decision: Decision, seconds: float) -> None:
        name = fuse.name
        with self._lock:
            series = self._series.get((name, op.name)) or self._new_series(fuse, op)
            series.latency[bisect_left(LATENCY_BUCKETS, seconds)] += 1
            series.total += seconds
            if decision.degraded:
                series.degraded += 1
                return
            if decision.allowed:
                series.allowed += 1
                if op.key in self._open:
                    del self._open[op.key]
                if op.name == "gate":
                    return  # an allowed gate says nothing of the rate
            else:
                series.refused += 1
                self._refused(series, op.key, decision)
            if op.name in _LOOP_OPS:
                return  # a count of one call and its threshold: not the key's rate
            bucket = decision.bucket
            if bucket is not None and bucket.near_limit:
                self._near_limit[name] = self._near_limit.get(name, 0) + 1
            seen = self._seen
            if op.key not in seen and len(seen) >= _MAX_KEYS:
                del seen[next(iter(seen))]  # the longest known: the table stays bounded
            seen[op.key] = (
                name,
                decision.key,
                decision.rate,
                decision.limit,
                decision.baseline,
                time.monotonic(),
            )

    def loop_passed(self, fuse: Fuse, op: Op[Any], seconds: float) -> None:
        """``decided`` for a failure-loop check allowed with nothing to report (the
        middleware's most frequent decision, ``_observe.loop_passed``): the same counts, with
        no ``Decision`` made for it. Allowed, it closes the key, as ``decided`` does; a loop
        step's rate stands for nothing (``_LOOP_OPS``), so nothing more is kept."""
        with self._lock:
            series = self._series.get((fuse.name, op.name)) or self._new_series(fuse, op)
            series.latency[bisect_left(LATENCY_BUCKETS, seconds)] += 1
            series.total += seconds
            series.allowed += 1
            if op.key in self._open:
                del self._open[op.key]

    def _new_series(self, fuse: Fuse, op: Op[Any]) -> _Series:
        """The series of ``op`` on ``fuse``, made at its first decision (under the lock)."""
        series = self._series[(fuse.name, op.name)] = _Series(
            _layer(fuse, op.name), fuse.name, op.name
        )
        return series

    def _refused(self, series: _Series, key: str, decision: Decision) -> None:
        error = decision.error
        reason = error.reason if error is not None else "refused"
        counted = (series.layer, series.fuse, reason)
        self._refusals[counted] = self._refusals.get(counted, 0) + 1
        if decision.tripped:
            self._trips[counted] = self._trips.get(counted, 0) + 1
        # An empty bucket opens nothing; a loop refusal closes one call, not the key.
        if error is not None and reason not in _KEY_STAYS_CLOSED:
            if key not in self._open and len(self._open) >= _MAX_OPEN:
                del self._open[next(iter(self._open))]
            self._open[key] = time.time() + error.retry_after

    def store_failed(self, fuse: Fuse, op: Op[Any], error: Exception) -> None:
        counted = (fuse.name, op.name)
        with self._lock:
            self._store_errors[counted] = self._store_errors.get(counted, 0) + 1

    def metered(self, identity: Identity, usage: Usage, call: CallFacts) -> None:
        estimated = "true" if usage.estimated else "false"
        provider, model, tokens = usage.provider, call.model, self._tokens
        with self._lock:
            if model not in self._models:
                if len(self._models) >= MAX_MODELS:
                    model = "other"
                else:
                    self._models.add(model)
            if usage.input is None and usage.output is None:
                if usage.total:
                    counted = (provider, model, "total", estimated)
                    tokens[counted] = tokens.get(counted, 0.0) + usage.total
                return
            if usage.input:
                counted = (provider, model, "input", estimated)
                tokens[counted] = tokens.get(counted, 0.0) + usage.input
            if usage.output:
                counted = (provider, model, "output", estimated)
                tokens[counted] = tokens.get(counted, 0.0) + usage.output

    # -- what exporters read -----------------------------------------------------------------

    def open_keys(self, now: float | None = None) -> dict[str, int]:
        """Keys this process saw refused that are still open, per fuse."""
        now = time.time() if now is None else now
        with self._lock:
            closes = list(self._open.items())
        counts: dict[str, int] = {}
        for key, until in closes:
            if until > now:
                fuse = key.partition(":")[0]
                counts[fuse] = counts.get(fuse, 0) + 1
        return counts

    def busiest(self, now: float | None = None) -> list[KeySeen]:
        """The keys with series of their own: the allow-listed ones, and the ``top`` highest
        rates among the keys decided on in the last five minutes."""
        now = time.monotonic() if now is None else now
        with self._lock:
            known = list(self._seen.items())
        seen = [
            KeySeen(fuse, key.partition(":")[2][:KEY_ID_LENGTH], label, rate, limit, base, at)
            for key, (fuse, label, rate, limit, base, at) in known
        ]
        listed = [key for key in seen if key.key_id in self.keys or key.label in self.keys]
        chosen = {(key.fuse, key.key_id) for key in listed}
        recent = [
            key
            for key in seen
            if now - key.seen <= _RECENT and (key.fuse, key.key_id) not in chosen
        ]
        recent.sort(key=lambda key: -key.rate)
        return listed + recent[: max(self.top, 0)]

    def snapshot(self) -> dict[str, Any]:
        """Copies of the counters, taken under the lock, keyed by their labels' values."""
        with self._lock:
            series = list(self._series.values())
            decisions = {
                (one.layer, one.fuse, one.op, outcome): count
                for one in series
                for outcome, count in (
                    ("allowed", one.allowed),
                    ("refused", one.refused),
                    ("degraded", one.degraded),
                )
                if count
            }
            latency: dict[tuple[str, str], tuple[list[int], float]] = {}
            for one in series:
                counts, total = latency.get((one.layer, one.op), ([0] * _SLOTS, 0.0))
                merged = [a + b for a, b in zip(counts, one.latency, strict=True)]
                latency[(one.layer, one.op)] = (merged, total + one.total)
            return {
                "tokens": dict(self._tokens),
                "decisions": decisions,
                "refusals": dict(self._refusals),
                "trips": dict(self._trips),
                "store_errors": dict(self._store_errors),
                "near_limit": dict(self._near_limit),
                "latency": latency,
                "models": len(self._models),
            }
