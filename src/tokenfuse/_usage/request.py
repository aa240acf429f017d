"""The request side of stream usage: whether a request asks for it, and asking for it.

OpenAI-style chat/completions and legacy completions streams carry usage only when the request
says ``"stream_options": {"include_usage": true}``; without it a stream reports nothing at all.
`with_usage_option` adds the option to a request body that goes without it, and
`refuses_usage_option` recognises the error of a server that does not accept the option.
Which endpoints take the option is the providers' table (`providers.takes_usage_option`).
"""

from __future__ import annotations

import json

from .decoding import make_decoder

__all__ = ["ERROR_HEAD", "refuses_usage_option", "streams_without_usage", "with_usage_option"]

_OPTION = b'"stream_options":{"include_usage":true}'
# Enough of an error body to find the field it names; error bodies are a few hundred bytes.
ERROR_HEAD = 16 * 1024


def _streaming_request(body: bytes) -> dict[str, object] | None:
    """The parsed body of a JSON request that asks for a stream, else None."""
    if body.find(b'"stream"') < 0:  # most requests do not stream: no parsing for them
        return None
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(parsed, dict) or parsed.get("stream") is not True:
        return None
    return parsed


def _asks_usage(request: dict[str, object]) -> bool:
    options = request.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def streams_without_usage(body: bytes) -> bool:
    """Whether ``body`` asks for a stream without asking for its usage.

    >>> streams_without_usage(b'{"model": "m", "stream": true}')
    True
    >>> streams_without_usage(b'{"stream": true, "stream_options": {"include_usage": true}}')
    False
    """
    request = _streaming_request(body)
    return request is not None and not _asks_usage(request)


def with_usage_option(body: bytes) -> bytes | None:
    """``body`` asking for the stream's usage, or None when it needs no change or cannot take one.

    The option is added at the end of the body, which stays byte for byte what the caller sent
    otherwise. When the body has ``stream_options`` already (without ``include_usage: true``)
    it is rewritten with ``include_usage`` set among the other options, in the same key order.

    >>> with_usage_option(b'{"model": "m", "stream": true}')
    b'{"model": "m", "stream": true,"stream_options":{"include_usage":true}}'
    >>> with_usage_option(b'{"model": "m"}') is None
    True
    """
    request = _streaming_request(body)
    if request is None or _asks_usage(request):
        return None
    if "stream_options" not in request:
        end = body.rfind(b"}")  # the object's own closing brace: only blanks may follow it
        return body[:end] + b"," + _OPTION + body[end:]
    options = request["stream_options"]
    if options is not None and not isinstance(options, dict):
        return None  # not an object: the server would refuse it with or without us
    request["stream_options"] = {**(options or {}), "include_usage": True}
    try:
        return json.dumps(request, ensure_ascii=False, separators=(",", ":")).encode()
    except (ValueError, UnicodeEncodeError):  # lone surrogates from \ud800-style escapes
        return None


def refuses_usage_option(head: bytes, content_encoding: str = "") -> bool:
    """Whether the (start of the) body of an error response names the usage option.

    A server that validates fields strictly answers a request with ``stream_options`` with a
    400 (or 422) whose message names the field: nothing was generated, and the request can be
    sent again without it.

    >>> refuses_usage_option(b'{"error": {"message": "Unknown argument: stream_options"}}')
    True
    """
    try:
        decoder = make_decoder(content_encoding, ERROR_HEAD)
    except ValueError:
        return False
    text = head if decoder is None else b"".join(decoder.decode(head))
    return text.find(b"stream_options") >= 0 or text.find(b"include_usage") >= 0
