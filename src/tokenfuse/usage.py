"""Token usage extraction: teach tokenfuse where a provider reports the tokens it used.

When the usage fits a table of field paths, describe it with ``UsageShape`` and register a
``ShapeExtractor``; it then gets JSON bodies, SSE and NDJSON streams, compression and
estimates like the built-in providers::

    from tokenfuse.usage import ShapeExtractor, UsageShape, default_registry

    default_registry.register(ShapeExtractor(
        UsageShape(containers=(("meta", "tokens"),), input=("in",), output=("out",)),
        provider="acme", host="llm.acme.internal"))
    # {"meta": {"tokens": {"in": 12, "out": 30}}} from llm.acme.internal now counts 42.

For anything else, write an ``Extractor`` (``reader_for(ResponseInfo) -> UsageReader | None``)
and a ``UsageReader``. A transport reads with ``default_registry`` unless given its own
``ExtractorRegistry`` (``FuseTransport(registry=...)``). docs/usage-formats.md lists where
each built-in provider reports usage.
"""

from ._usage import (
    Extractor,
    ExtractorRegistry,
    ResponseInfo,
    ShapeExtractor,
    Usage,
    UsageReader,
    UsageShape,
    default_registry,
)

__all__ = [
    "Extractor",
    "ExtractorRegistry",
    "ResponseInfo",
    "ShapeExtractor",
    "Usage",
    "UsageReader",
    "UsageShape",
    "default_registry",
]
