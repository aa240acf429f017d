"""Token usage extraction from LLM responses: pure, incremental, no I/O.

An HTTP client describes each response once its headers are known, asks for its reader, feeds
it every raw body chunk as it passes (still compressed: the reader decodes its own copy), and
asks for the result when the body ends or is closed::

    reader = reader_for_response(ResponseHead(
        method="POST", url="https://api.openai.com/v1/chat/completions",
        host="api.openai.com", path="/v1/chat/completions", status_code=200,
        request_headers={}, response_headers={"content-type": "text/event-stream"}), registry)
    if reader is not None:          # None: not an LLM call worth counting
        for chunk in raw_chunks:
            reader.feed(chunk)      # never raises, never delays the chunk
        usage = reader.finish(complete=reached_end_of_body)   # never raises

``ExtractorRegistry.reader_for`` does the same from the response's parts, normalising them.

`Usage.total` is None when unknown (with `problem` saying why), never silently 0; a 0 comes
only with `counts_nothing=True` (count-tokens endpoints, GET retrievals, error responses).

Custom providers: an extractor is any object with ``reader_for(info) -> UsageReader | None``
(see `Extractor`); registered extractors are consulted before the built-ins. When the usage
fits a table of field paths, `ShapeExtractor` does the rest (JSON, SSE, NDJSON, eventstream,
compression, streams, estimates)::

    from tokenfuse._usage import ShapeExtractor, UsageShape, default_registry

    default_registry.register(ShapeExtractor(
        UsageShape(containers=(("meta", "tokens"),), input=("in",), output=("out",)),
        provider="acme", host="llm.acme.internal"))
    # {"meta": {"tokens": {"in": 12, "out": 30}}} from llm.acme.internal now counts 42.

For anything else, implement `UsageReader` (``feed(chunk)``, ``finish(*, complete)``) yourself;
exceptions from custom extractors and readers are contained (the response reads as unknown).

Two internal modules look at the request side for the transport: `request` asks OpenAI-style
streams for their usage (``stream_options.include_usage``), and `estimate` turns the text a call
sent and received into a flagged estimate when its response reported no usage.
"""

from .model import ResponseHead, ResponseInfo, Usage, UsageReader, UsageShape
from .registry import (
    Extractor,
    ExtractorRegistry,
    ShapeExtractor,
    default_registry,
    reader_for_response,
)

__all__ = [
    "Extractor",
    "ExtractorRegistry",
    "ResponseHead",
    "ResponseInfo",
    "ShapeExtractor",
    "Usage",
    "UsageReader",
    "UsageShape",
    "default_registry",
    "reader_for_response",
]
