"""Token usage extraction: teach tokenfuse where a provider reports the tokens it used.

When the usage fits a table of field paths, describe it with ``UsageShape`` and register a
``ShapeExtractor``; it then gets JSON bodies, SSE and NDJSON streams, compression and
estimates like the built-in providers::

    from tokenfuse.usage import ShapeExtractor, UsageShape, default_registry

    billing = UsageShape(containers=(("billing",),), input=("prompt",), output=("reply",))
    default_registry.register(ShapeExtractor(billing, provider="inhouse", host="llm.corp"))
    # {"billing": {"prompt": 900, "reply": 100}} from llm.corp (or a.llm.corp) counts 1000.

For anything else, write an ``Extractor`` (``reader_for(ResponseInfo) -> UsageReader | None``)
and a ``UsageReader``. A transport reads with ``default_registry`` unless given its own
``ExtractorRegistry`` (``FuseTransport(registry=...)``). docs/usage-formats.md lists where
each built-in provider reports usage.
"""

# This module is the public face of _usage: the names that package exports, no more.
from ._usage import *  # noqa: F403
from ._usage import __all__ as __all__
