"""The ``Tally`` as Prometheus metrics: a collector read at scrape time.

With ``prometheus_client`` installed, the first ``Fuse`` of a process registers one on the
default registry (``install_default``), so an application that already serves ``/metrics``
serves tokenfuse's too. docs/metrics.md describes each metric.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterator
from typing import Any

from prometheus_client.core import (
    REGISTRY,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from .._observe import install
from .tally import LATENCY_BUCKETS, Tally

__all__ = ["TallyCollector", "configure_keys", "default_tally", "install_default"]


def _counter(name: str, doc: str, labels: list[str], values: dict[Any, float]) -> Metric:
    family = CounterMetricFamily(name, doc, labels=labels)
    for key, value in sorted(values.items()):
        family.add_metric([*key] if isinstance(key, tuple) else [key], value)
    return family


class TallyCollector(Collector):
    """Exposes a ``Tally``: register it on a ``CollectorRegistry``.

    >>> from prometheus_client import CollectorRegistry
    >>> registry = CollectorRegistry()
    >>> registry.register(TallyCollector(Tally()))
    """

    def __init__(self, tally: Tally) -> None:
        self.tally = tally

    def collect(self) -> Iterator[Metric]:
        counts = self.tally.snapshot()
        yield _counter(
            "tokenfuse_tokens",
            "LLM tokens counted by the transports, by provider, model, token type "
            "(input, output; total when the split is unknown) and whether estimated.",
            ["provider", "model", "token_type", "estimated"],
            counts["tokens"],
        )
        yield _counter(
            "tokenfuse_decisions",
            "Decisions taken, by layer (outbound, inbound), fuse, operation (gate, record, "
            "admit) and outcome (allowed, refused, degraded: the store failed, failing open).",
            ["layer", "fuse", "operation", "outcome"],
            counts["decisions"],
        )
        yield _counter(
            "tokenfuse_refusals",
            "Refused decisions by layer, fuse and reason (loop_suspected, manual_ceiling, "
            "cold_start_ceiling, quota_exhausted).",
            ["layer", "fuse", "reason"],
            counts["refusals"],
        )
        yield _counter(
            "tokenfuse_trips",
            "Keys opened (the decision that tripped), by layer, fuse and reason.",
            ["layer", "fuse", "reason"],
            counts["trips"],
        )
        yield _counter(
            "tokenfuse_store_errors",
            "Store calls that failed (each fails open unless fail_closed), by fuse and operation.",
            ["fuse", "operation"],
            counts["store_errors"],
        )
        yield _counter(
            "tokenfuse_near_limit_episodes",
            "Callers that stayed near their bucket's limit long enough to fire near_limit.",
            ["fuse"],
            counts["near_limit"],
        )
        open_now = GaugeMetricFamily(
            "tokenfuse_keys_open",
            "Keys this process saw refused that are still open (refusing every call).",
            labels=["fuse"],
        )
        for fuse, count in sorted(self.tally.open_keys().items()):
            open_now.add_metric([fuse], count)
        yield open_now
        latency = HistogramMetricFamily(
            "tokenfuse_decision_seconds",
            "Time a decision spent in the store (one round trip for Redis), by layer and "
            "operation.",
            labels=["layer", "operation"],
        )
        for (layer, op), (buckets, total) in sorted(counts["latency"].items()):
            cumulative, running = [], 0
            for bound, count in zip((*map(str, LATENCY_BUCKETS), "+Inf"), buckets, strict=True):
                running += count
                cumulative.append((bound, float(running)))
            latency.add_metric([layer, op], cumulative, total)
        yield latency
        yield from self._per_key()

    def _per_key(self) -> Iterator[Metric]:
        labels = ["fuse", "key_id", "key"]
        rate = GaugeMetricFamily(
            "tokenfuse_key_rate",
            "The key's rate over the last 60 s at its latest decision (allow-listed keys and "
            "the busiest: TOKENFUSE_METRICS_KEYS, TOKENFUSE_METRICS_TOP).",
            labels=labels,
        )
        threshold = GaugeMetricFamily(
            "tokenfuse_key_threshold",
            "The rate per minute at which the key would trip, at its latest decision.",
            labels=labels,
        )
        baseline = GaugeMetricFamily(
            "tokenfuse_key_baseline",
            "The key's established baseline per active minute, at its latest decision.",
            labels=labels,
        )
        for key in self.tally.busiest():
            names = [key.fuse, key.key_id, key.label]
            rate.add_metric(names, key.rate)
            if key.threshold is not None:
                threshold.add_metric(names, key.threshold)
            if key.baseline is not None:
                baseline.add_metric(names, key.baseline)
        yield from (rate, threshold, baseline)


_default: Tally | None = None
_lock = threading.Lock()


def default_tally() -> Tally | None:
    """The tally behind the default registry's tokenfuse metrics (None until installed)."""
    return _default


def install_default(keys: Collection[str] = (), top: int = 10) -> Tally:
    """Count every decision and call of the process, exposed on the default registry."""
    return install_on(REGISTRY, keys, top)


def install_on(registry: CollectorRegistry, keys: Collection[str] = (), top: int = 10) -> Tally:
    """Count every decision and call of the process, exposed on ``registry`` (once: later
    calls return the same tally)."""
    global _default
    with _lock:
        if _default is None:
            _default = Tally(keys, top)
            registry.register(TallyCollector(_default))
            install(_default)
        return _default


def configure_keys(keys: Collection[str], top: int) -> None:
    """Change which keys get series of their own (``configure(metrics_keys=..., ...)``)."""
    if _default is not None:
        _default.keys, _default.top = frozenset(keys), top
