"""Estimates for calls whose usage was not reported: bytes of text, at a fixed ratio.

When a response carries no usage (an OpenAI-style stream that was not asked for it, a stream
closed before its usage arrived, a body that could not be read) an unknown amount would be
recorded as nothing, and a loop of such calls would never be stopped. The estimate counts:

* **output**: the bytes of the generated text the response carried (the values of the shape's
  `text_keys`, as sent, JSON escapes included), found by a C-level search per key over runs
  of stream records, so the estimate costs the stream's hot path almost nothing;
* **input**: the bytes of the text the request sent (messages, prompt, input, instructions,
  system prompt, tool definitions; not inline images, audio or files), which is what grows
  from call to call in a loop;

at `BYTES_PER_TOKEN` bytes per token, rounded up. English text runs at about 4 bytes per token
with the common tokenizers; other scripts take fewer bytes per token, so the estimate errs
low for them, as it does for images (not counted at all). An estimate is always flagged
(`Usage.estimated`) and never replaces reported numbers.
"""

from __future__ import annotations

import json
import math
import re

from .model import Usage

__all__ = [
    "BYTES_PER_TOKEN",
    "TextCounter",
    "reported",
    "request_text_bytes",
    "tokens_for",
    "with_input",
]

#: The documented ratio of every estimate: 4 bytes of text per token.
BYTES_PER_TOKEN = 4

# What a request sends as text, by provider: OpenAI (chat, completions, Responses), Anthropic,
# Gemini, Bedrock Converse, Cohere, Ollama.
_INPUT_KEYS = frozenset(
    {
        "messages",
        "prompt",
        "input",
        "instructions",
        "system",
        "contents",
        "systemInstruction",
        "tools",
        "functions",
    }
)
# Inline media: base64 or URLs, billed (if at all) by size or resolution, not as text.
_MEDIA_KEYS = frozenset(
    {"data", "url", "image_url", "file_data", "b64_json", "inline_data", "inlineData", "bytes"}
)


def tokens_for(text_bytes: int) -> float:
    """Tokens estimated for ``text_bytes`` bytes of text.

    >>> tokens_for(10)
    3.0
    """
    return float(math.ceil(text_bytes / BYTES_PER_TOKEN)) if text_bytes > 0 else 0.0


class TextCounter:
    """Counts the bytes of JSON string values under some keys, in raw JSON text.

    One regex per key, each starting with the quoted key; a quoted key cannot occur inside a
    JSON string (its quotes would be escaped), and values that are not strings
    (``"content": null``, ``"delta": {...}``) do not match. The regex starts where ``find``
    sees the quoted key first: ``find``'s search is twice as fast as the regex engine's own
    search for its literal prefix, so text without a key (most keys, in most streams) costs
    half a regex pass for it.

    >>> TextCounter(("content",)).count(b'{"delta": {"content": "Hello"}}')
    5
    """

    __slots__ = ("_patterns",)

    def __init__(self, keys: tuple[str, ...]) -> None:
        self._patterns = tuple(
            (
                quoted := b'"%s"' % key.encode(),
                re.compile(
                    re.escape(quoted) + rb'[ \t\r\n]*:[ \t\r\n]*"([^"\\]*(?:\\.[^"\\]*)*)"',
                    re.DOTALL,
                ),
            )
            for key in keys
        )

    def count(self, data: bytes | bytearray) -> int:
        total = 0
        for quoted, pattern in self._patterns:
            at = data.find(quoted)
            if at < 0:
                continue
            for match in pattern.finditer(data, at):
                total += match.end(1) - match.start(1)
        return total


def request_text_bytes(body: bytes) -> int:
    """Bytes of text a request body sends to the model (the input of an estimate).

    The UTF-8 bytes of the string values under the body's input keys (messages, prompt,
    input, ...), at any depth, without inline media. A body that is not a JSON object counts
    whole: whatever it is, it was sent.

    >>> request_text_bytes(b'{"model": "m", "messages": [{"role": "user", "content": "Hi"}]}')
    6
    """
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return len(body)
    if not isinstance(parsed, dict):
        return len(body)
    total = 0
    stack: list[object] = [value for key, value in parsed.items() if key in _INPUT_KEYS]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            if not node.startswith("data:"):
                total += len(node) if node.isascii() else len(node.encode("utf-8", "replace"))
        elif isinstance(node, dict):
            stack.extend(value for key, value in node.items() if key not in _MEDIA_KEYS)
        elif isinstance(node, list):
            stack.extend(node)
    return total


def reported(usage: Usage) -> bool:
    """Whether ``usage`` is what the response reported (even partial), or counts nothing by
    design: ``with_input`` leaves it as it is, so the request's body need not be read."""
    return usage.counts_nothing or (usage.known and not usage.estimated)


def with_input(usage: Usage, request_body: bytes | None) -> Usage:
    """``usage`` with what the request sent estimated, when the response reported nothing.

    Reported usage (even partial) and responses that count nothing by design are returned as
    they are. An unknown amount, or an estimate of the output alone, becomes the estimate of
    input and output together; it stays unknown only when there is nothing to estimate from.

    >>> with_input(Usage.unknown("openai", "no usage in stream"), b'{"prompt": "12345678"}').total
    2.0
    """
    if reported(usage):
        return usage
    input_ = tokens_for(request_text_bytes(request_body)) if request_body else 0.0
    output = usage.output if usage.estimated else None
    total = input_ + (output or 0.0)
    if total <= 0:
        return usage
    return Usage(
        total=total,
        input=input_,
        output=output,
        provider=usage.provider,
        partial=usage.partial,
        estimated=True,
        problem=usage.problem,
    )
