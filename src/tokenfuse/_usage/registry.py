"""Choosing a reader for a response: user extractors first, then the built-in providers.

`reader_for_response` is the entry an HTTP client (the transport) calls, once per response.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Protocol

from .model import ResponseFacts, ResponseHead, ResponseInfo, UsageReader, UsageShape, response_info
from .providers import builtin_reader
from .readers import GuardedReader, endpoint_reader


class Extractor(Protocol):
    """Something that can read usage for some responses.

    Return a reader for responses you recognise and None for the rest (the next extractor, and
    finally the built-ins, get them). Exceptions are treated as None.
    """

    def reader_for(self, info: ResponseInfo) -> UsageReader | None: ...


class ShapeExtractor:
    """An extractor for a custom host or endpoint whose usage fits a `UsageShape` table.

    It reads JSON bodies, SSE, NDJSON and eventstream, compressed or not, with the same rules
    as the built-ins (only POST counts, count-nothing for errors without usage).

    >>> shape = UsageShape(containers=(("meta", "tokens"),), input=("in",), output=("out",))
    >>> extractor = ShapeExtractor(shape, provider="acme", host="llm.acme.internal")
    """

    def __init__(
        self,
        shape: UsageShape,
        *,
        provider: str,
        host: str | None = None,
        path: str | None = None,
    ) -> None:
        self.shape = shape
        self.provider = provider
        self.host = host.lower() if host else None
        self.path = re.compile(path) if path else None

    def reader_for(self, info: ResponseInfo) -> UsageReader | None:
        if self.host and info.host != self.host and not info.host.endswith("." + self.host):
            return None
        if self.path and not self.path.search(info.path):
            return None
        return endpoint_reader(info, self.shape, self.provider)


class ExtractorRegistry:
    """Picks the usage reader for each response.

    >>> reader = ExtractorRegistry().reader_for(
    ...     method="POST", url="https://api.openai.com/v1/chat/completions", status_code=200,
    ...     request_headers={}, response_headers={"content-type": "application/json"})
    >>> reader.feed(b'{"usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}')
    >>> reader.finish(complete=True).total
    7.0
    """

    def __init__(self) -> None:
        self._extractors: list[Extractor] = []

    def register(self, extractor: Extractor) -> None:
        """Consult `extractor` before the built-ins (and before extractors registered earlier)."""
        self._extractors.insert(0, extractor)

    def reader_for(
        self,
        *,
        method: str,
        url: str,
        status_code: int,
        request_headers: Mapping[str, str] | None,
        response_headers: Mapping[str, str],
        estimate: bool = False,
    ) -> UsageReader | None:
        """The reader for one response, or None when it is not an LLM call worth counting
        (an unknown endpoint whose content-type cannot carry usage). Never raises."""
        try:
            info = response_info(
                method=method,
                url=url,
                status_code=status_code,
                request_headers=request_headers,
                response_headers=response_headers,
                estimate=estimate,
            )
        except Exception:
            return None
        return self._reader(info)

    def _reader(self, response: ResponseFacts) -> UsageReader | None:
        # The registered extractors see the response as a `ResponseInfo`, made only when there
        # are any; the built-ins read whichever description they are handed.
        if self._extractors:
            try:
                response = response.describe()
            except Exception:
                return None
            for extractor in tuple(self._extractors):
                try:
                    reader = extractor.reader_for(response)
                except Exception:
                    continue
                if reader is not None:
                    return GuardedReader(reader)
        try:
            return builtin_reader(response)
        except Exception:
            return None


default_registry = ExtractorRegistry()


def reader_for_response(
    response: ResponseHead, registry: ExtractorRegistry = default_registry
) -> UsageReader | None:
    """The usage reader for one response, or None when it is not an LLM call worth counting.

    The one entry for an HTTP client, called once per response before its body: feed the
    reader every raw body chunk, then ``finish``. The reader never raises. A registry that
    overrides ``reader_for`` is asked through it (its exceptions propagate: they are the
    caller's to contain), and the reader it returns is guarded like an extractor's.

    >>> reader = reader_for_response(ResponseHead(
    ...     method="POST", url="https://api.openai.com/v1/chat/completions",
    ...     host="api.openai.com", path="/v1/chat/completions", status_code=200,
    ...     request_headers={}, response_headers={"content-type": "application/json"}))
    >>> reader.feed(b'{"usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}')
    >>> reader.finish(complete=True).total
    7.0
    """
    # A registry that only holds extractors reads `response` as it is; one that overrides
    # `reader_for` (or any object with that method) is asked through it, with the parts.
    if getattr(type(registry), "reader_for", None) is ExtractorRegistry.reader_for:
        return registry._reader(response)
    reader = registry.reader_for(
        method=response.method,
        url=str(response.url),
        status_code=response.status_code,
        request_headers=response.request_headers,
        response_headers=_AnyCase(response.response_headers),
        estimate=response.estimate,
    )
    return None if reader is None else GuardedReader(reader)


class _AnyCase(Mapping[str, str]):
    """Lower-case headers that answer lookups in any case, as an HTTP client's headers do."""

    __slots__ = ("_headers",)

    def __init__(self, headers: Mapping[str, str]) -> None:
        self._headers = headers

    def __getitem__(self, name: str) -> str:
        return self._headers[name.lower()]

    def __iter__(self) -> Iterator[str]:
        return iter(self._headers)

    def __len__(self) -> int:
        return len(self._headers)
