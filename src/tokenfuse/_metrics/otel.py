"""The OpenTelemetry GenAI token-usage histogram, ``gen_ai.client.token.usage``.

Recorded once per token type (``input``, ``output``) of every outbound call the transports
meter, with ``gen_ai.operation.name``, ``gen_ai.provider.name``, ``gen_ai.token.type`` and
``gen_ai.request.model`` as the GenAI semantic conventions describe, through
``opentelemetry-api`` only: the application's ``MeterProvider`` (the SDK, an exporter) decides
where it goes; without one the API's no-op provider drops it. Installed by the first ``Fuse``
of a process when ``opentelemetry-api`` is installed (``install_default``).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics
from opentelemetry.metrics import NoOpHistogram

from .._observe import CallFacts, install

if TYPE_CHECKING:
    from .._identity import Identity
    from .._usage import Usage

__all__ = ["PROVIDER_NAMES", "TOKEN_BUCKETS", "GenAITokenUsage", "install_default"]

#: tokenfuse's provider names as the conventions' ``gen_ai.provider.name`` values.
PROVIDER_NAMES = {
    "azure": "azure.ai.openai",
    "gemini": "gcp.gemini",
    "bedrock": "aws.bedrock",
    "mistral": "mistral_ai",
}
#: The conventions' advised bucket boundaries for token counts.
TOKEN_BUCKETS = [
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
]  # fmt: skip


class GenAITokenUsage:
    """A usage observer recording ``gen_ai.client.token.usage`` on a meter provider's meter.

    >>> from opentelemetry.sdk.metrics import MeterProvider   # doctest: +SKIP
    >>> install(GenAITokenUsage(MeterProvider(metric_readers=[reader])))  # doctest: +SKIP
    """

    def __init__(self, meter_provider: Any = None) -> None:
        from .. import __version__

        provider = meter_provider if meter_provider is not None else metrics.get_meter_provider()
        meter = provider.get_meter("tokenfuse", __version__)
        self.histogram = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Measures number of input and output tokens used",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
        )

    def metered(self, identity: Identity, usage: Usage, call: CallFacts) -> None:
        histogram = self.histogram
        # Nowhere: the API's no-op histogram, or the API's proxy while no ``MeterProvider``
        # is set (the default when the application configures no OpenTelemetry SDK). Then a
        # call builds no attributes for it. The proxy keeps what it forwards to in
        # ``_real_instrument``: checked on every call, so a provider set later is recorded on
        # at once; an instrument without that attribute is recorded on as always.
        if getattr(histogram, "_real_instrument", histogram) is None or isinstance(
            histogram, NoOpHistogram
        ):
            return
        attributes = {
            "gen_ai.operation.name": call.operation,
            "gen_ai.provider.name": PROVIDER_NAMES.get(usage.provider, usage.provider),
        }
        if call.model != "unknown":
            attributes["gen_ai.request.model"] = call.model
        for kind, amount in (("input", usage.input), ("output", usage.output)):
            if amount is not None:
                histogram.record(amount, {**attributes, "gen_ai.token.type": kind})


_installed: GenAITokenUsage | None = None
_lock = threading.Lock()


def install_default() -> GenAITokenUsage:
    """Record on the global meter provider (the API's proxy follows a provider set later)."""
    global _installed
    with _lock:
        if _installed is None:
            _installed = GenAITokenUsage()
            install(_installed)
        return _installed
