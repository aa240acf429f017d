"""Metrics: Prometheus and the OpenTelemetry GenAI token-usage histogram, with no code.

With ``prometheus_client`` installed (the ``prometheus`` extra), tokenfuse's metrics are on
its default registry from the first ``Fuse`` of the process on: an application that serves
``/metrics`` serves them too. With ``opentelemetry-api`` installed (the ``otel`` extra), every
outbound call's tokens go to the ``gen_ai.client.token.usage`` histogram of the global meter
provider. ``TOKENFUSE_METRICS=0`` turns both off. docs/metrics.md describes each metric.

To count into a registry of your own, or to watch decisions yourself::

    from prometheus_client import CollectorRegistry
    from tokenfuse.metrics import Tally, TallyCollector, install

    tally = Tally(keys={"agent-42"}, top=5)
    install(tally)                                   # every fuse and transport of the process
    registry = CollectorRegistry()
    registry.register(TallyCollector(tally))

An observer is anything with ``decided``/``store_failed`` (every decision) or ``metered`` (every
metered call) methods; they run on the hot path, so they must be quick and do no I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._metrics.tally import LATENCY_BUCKETS, KeySeen, Tally
from ._observe import CallFacts, DecisionObserver, UsageObserver, install

if TYPE_CHECKING:
    from typing import Any

    from ._metrics.otel import GenAITokenUsage
    from ._metrics.prometheus import TallyCollector, default_tally

__all__ = [
    "LATENCY_BUCKETS",
    "CallFacts",
    "DecisionObserver",
    "GenAITokenUsage",
    "KeySeen",
    "Tally",
    "TallyCollector",
    "UsageObserver",
    "default_tally",
    "install",
]

# Each needs its optional package: imported only when asked for.
_OPTIONAL = {
    "TallyCollector": "_metrics.prometheus",
    "default_tally": "_metrics.prometheus",
    "GenAITokenUsage": "_metrics.otel",
}


def __getattr__(name: str) -> Any:
    from importlib import import_module

    module = _OPTIONAL.get(name)
    if module is None:
        raise AttributeError(f"module 'tokenfuse.metrics' has no attribute {name!r}")
    return getattr(import_module(f"tokenfuse.{module}"), name)
