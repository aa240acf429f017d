"""Choosing a reader for a response: user extractors first, then the built-in providers."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Protocol
from urllib.parse import urlsplit

from .model import ResponseFacts, ResponseInfo, UsageReader, UsageShape
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


def _lower(headers: Mapping[str, str] | None) -> dict[str, str]:
    # httpx.Headers is case-insensitive, a plain dict is not: normalise both.
    return {str(k).lower(): str(v) for k, v in headers.items()} if headers else {}


def response_info(
    *,
    method: str,
    url: str,
    status_code: int,
    request_headers: Mapping[str, str] | None,
    response_headers: Mapping[str, str],
    estimate: bool = False,
) -> ResponseInfo:
    parts = urlsplit(str(url))
    return ResponseInfo(
        method=str(method).upper(),
        url=str(url),
        host=(parts.hostname or "").lower(),
        path=parts.path,
        query=parts.query,
        status_code=int(status_code),
        request_headers=_lower(request_headers),
        response_headers=_lower(response_headers),
        estimate=bool(estimate),
    )


class ResponseHead(ResponseFacts):
    """A response as the built-in readers see it, for a caller on a hot path (the transport).

    Only what they look at, taken from what the caller has already parsed: no URL string is
    built and split again, and the request headers (which no built-in reads) are not copied.
    ``response_headers`` must answer lookups by lower-case name. `describe` makes the full
    `ResponseInfo`, normalised as `reader_for` does, for registered extractors.
    """

    __slots__ = (
        "estimate",
        "host",
        "method",
        "path",
        "request_headers",
        "response_headers",
        "status_code",
        "url",
    )

    def __init__(
        self,
        *,
        method: str,
        url: object,
        host: str,
        path: str,
        status_code: int,
        request_headers: Mapping[str, str] | None,
        response_headers: Mapping[str, str],
        estimate: bool,
    ) -> None:
        self.method = method  # upper-case
        self.url = url  # anything whose str() is the URL (an httpx URL)
        self.host = host  # lower-case, without port
        self.path = path  # as sent, still %-encoded
        self.status_code = status_code
        self.request_headers = request_headers
        self.response_headers = response_headers
        self.estimate = estimate

    def describe(self) -> ResponseInfo:
        return response_info(
            method=self.method,
            url=str(self.url),
            status_code=self.status_code,
            request_headers=self.request_headers,
            response_headers=self.response_headers,
            estimate=self.estimate,
        )


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
        return self.reader_for_info(info)

    def reader_for_head(self, head: ResponseHead) -> UsageReader | None:
        """`reader_for` for a response described by a `ResponseHead`. The built-ins read the
        head as it is; the full `ResponseInfo` is made only when extractors are registered."""
        if self._extractors:
            try:
                info = head.describe()
            except Exception:
                return None
            return self.reader_for_info(info)
        try:
            return builtin_reader(head)
        except Exception:
            return None

    def reader_for_info(self, info: ResponseInfo) -> UsageReader | None:
        """`reader_for` with the response already described: the extractors, then the
        built-ins."""
        for extractor in tuple(self._extractors):
            try:
                reader = extractor.reader_for(info)
            except Exception:
                continue
            if reader is not None:
                return GuardedReader(reader)
        try:
            return builtin_reader(info)
        except Exception:
            return None


default_registry = ExtractorRegistry()
