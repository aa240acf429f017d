"""The usage side's values: `Usage`, `UsageShape`, what a response looks like, and counts.

A provider is described by data, not code: where its usage object sits in a payload, which
fields add up to input and output, and which field (if any) is the provider's own total. Every
reader applies the same combine rule to that table (see `UsageShape`).

A response arrives as a `ResponseHead` (what an HTTP client hands over); registered extractors
see it as a `ResponseInfo` (normalised, with the query and the request headers).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

# No single call reports a trillion tokens; a bigger number is corruption, not usage.
MAX_COUNT = 1e12


@dataclass(frozen=True, slots=True)
class Usage:
    """Token usage of one response, as far as it could be read.

    `total` is None when it is unknown; it is never silently 0. A 0 total is only reported with
    `counts_nothing=True`: count-tokens endpoints, GET retrievals and error responses, which
    really consume nothing.

    >>> Usage(total=30.0, input=10.0, output=20.0, provider="anthropic").known
    True
    >>> Usage.unknown("openai", "malformed JSON").total is None
    True
    """

    total: float | None
    input: float | None = None
    output: float | None = None
    provider: str = "unknown"
    partial: bool = False
    estimated: bool = False
    problem: str | None = None
    counts_nothing: bool = False

    @property
    def known(self) -> bool:
        """True when `total` holds a number (possibly partial or estimated)."""
        return self.total is not None

    @classmethod
    def unknown(cls, provider: str, problem: str, *, partial: bool = False) -> Usage:
        return cls(total=None, provider=provider, problem=problem, partial=partial)

    @classmethod
    def nothing(cls, provider: str) -> Usage:
        """A response that consumed no tokens by design (not an unknown amount)."""
        return cls(total=0.0, input=0.0, output=0.0, provider=provider, counts_nothing=True)


def as_count(value: object) -> float | None:
    """A valid token count as float, or None for anything else.

    JSON gives us bools (an int subclass), strings, NaN/Infinity (Python's json accepts them),
    negative numbers and arbitrarily large ints: none of these is a count.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    # One range check also rejects NaN (every comparison with NaN is False) and infinities.
    if not 0 <= value <= MAX_COUNT:
        return None
    return float(value)


def header_count(value: str | None) -> float | None:
    """A count sent as a header value (Bedrock InvokeModel): plain decimal digits only."""
    if value is None:
        return None
    text = value.strip()
    if not text.isascii() or not text.isdigit() or len(text) > 13:
        return None
    return as_count(int(text))


@dataclass(frozen=True, slots=True)
class UsageShape:
    """Where one provider family reports usage, as a table.

    containers: paths from a payload (one JSON body, SSE event or NDJSON line) to the object that
        holds the counts; ``()`` means the payload itself. The first path that yields a count wins.
    input, output: fields summed into input and output tokens.
    total: fields holding the provider's own total (first present wins).

    Combine rule, the same for every provider: values are kept per field and the last value seen
    wins (streams repeat running or cumulative totals; summing them would double count). The total
    is the provider's total field when present, else input + output. If a group is missing the
    sum is reported as partial with a problem (e.g. Ollama omits the prompt count on a cache hit).

    end_events: SSE event names / eventstream event types after which the response is complete.
    end_keys: byte strings whose presence in a payload means the same (Gemini's finishReason).
    whole_objects: every usage object in a stream holds all the counts so far (running totals,
        or one final object), so only the last one is read. False when fields arrive in
        different objects (Anthropic: input in message_start, output in message_delta).
    missing_hint: the problem reported for a complete stream that carried no usage.
    text_keys: the keys whose string values are generated text, wherever they sit in a payload;
        their bytes are what an estimate counts as output when no usage is reported.
    """

    containers: tuple[tuple[str, ...], ...]
    input: tuple[str, ...]
    output: tuple[str, ...]
    total: tuple[str, ...] = ()
    end_events: frozenset[bytes] = frozenset()
    end_keys: tuple[bytes, ...] = ()
    whole_objects: bool = True
    missing_hint: str = "no usage in stream"
    text_keys: tuple[str, ...] = ()

    @property
    def fields(self) -> tuple[str, ...]:
        return self.input + self.output + self.total


class ResponseFacts:
    """What the built-in readers look at in a response, whichever way it was described:
    `ResponseHead` (as an HTTP client hands it over) or `ResponseInfo` (as extractors see it)."""

    __slots__ = ()

    method: str  # upper-case
    host: str  # lower-case, without port
    path: str
    status_code: int
    response_headers: Mapping[str, str]  # answers lookups by lower-case name
    estimate: bool

    @property
    def content_type(self) -> str:
        """The media type without parameters, lower-case ("" when absent)."""
        return self.response_headers.get("content-type", "").partition(";")[0].strip().lower()

    @property
    def content_encoding(self) -> str:
        return self.response_headers.get("content-encoding", "")

    @property
    def ok(self) -> bool:
        return 200 <= self.status_code < 300

    def describe(self) -> ResponseInfo:
        """This response as registered extractors see it."""
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class ResponseInfo(ResponseFacts):
    """One response as an extractor sees it, before its body: header names are lower-case."""

    method: str  # upper-case
    url: str
    host: str  # lower-case, without port
    path: str
    query: str
    status_code: int
    request_headers: Mapping[str, str]
    response_headers: Mapping[str, str]
    estimate: bool = False

    def describe(self) -> ResponseInfo:
        return self


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
    """A `ResponseInfo` from a response's parts, normalised (raises on parts it cannot read)."""
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
    """One response, before its body, as an HTTP client that has parsed it describes it.

    What `reader_for_response` takes. Only what the built-in readers look at is needed in
    normalised form, so that the client can pass what it already holds: no URL string is built
    and split again, and the request headers are not copied. `describe` makes the full
    `ResponseInfo` when registered extractors need it.

    >>> head = ResponseHead(
    ...     method="POST", url="https://api.openai.com/v1/chat/completions",
    ...     host="api.openai.com", path="/v1/chat/completions", status_code=200,
    ...     request_headers={}, response_headers={"content-type": "application/json"})
    >>> head.content_type
    'application/json'
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
        estimate: bool = False,
    ) -> None:
        self.method = method  # upper-case
        self.url = url  # anything whose str() is the URL (an httpx URL)
        self.host = host  # lower-case, without port
        self.path = path  # as sent, still %-encoded
        self.status_code = status_code
        self.request_headers = request_headers
        self.response_headers = response_headers  # names in lower case
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


class UsageReader(Protocol):
    """Reads the usage of one response from its raw body chunks, as they pass.

    Neither method may raise: a reader reports bad input as `Usage(total=None, problem=...)`.
    """

    def feed(self, chunk: bytes) -> None:
        """Raw bytes exactly as they came off the wire (possibly still compressed)."""

    def finish(self, *, complete: bool) -> Usage:
        """End of the body; `complete=False` when it was closed before the end."""
        ...
