"""Metrics: counts kept off the hot path (``tally``), exported to Prometheus and OpenTelemetry."""
