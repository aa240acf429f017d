"""Finding usage objects in JSON text without parsing all of it.

Two places need this: stream payloads (a 400-byte Gemini chunk need not be parsed whole to read
its 100-byte `usageMetadata`) and bodies too large to buffer, of which only a tail window is
kept. The trick: look for the quoted usage key (`"usage"`, `"usageMetadata"`, ...) from the end,
check that a colon follows (so it is a key, not a string value), and decode just the value with
`json.JSONDecoder.raw_decode`, which parses one value at an offset and ignores what follows.

A quoted key cannot occur inside a JSON string (its quotes would be escaped), so a match is a
real key; when it holds no counts (a tool schema with a property called "usage", say) the
reader tries the previous occurrence.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import lru_cache
from json import JSONDecoder

from .model import UsageShape

MAX_VALUE = 64 * 1024  # a usage object is a few hundred bytes; a bigger value is something else
_MAX_TRIES = 32  # occurrences tried per key; bounds the work on hostile input

_decoder = JSONDecoder()
_COLON = re.compile(rb"[ \t\r\n]*:[ \t\r\n]*")


def _quoted(key: str) -> bytes:
    return f'"{key}"'.encode()


def value_after(data: bytes, at: int) -> object:
    """The JSON value after a key that ends at `at`; None if no `: value` follows."""
    colon = _COLON.match(data, at)
    if colon is None:
        return None
    start = colon.end()
    # The slice may begin or end inside a UTF-8 sequence: replace, never fail.
    text = data[start : start + MAX_VALUE].decode("utf-8", "replace")
    try:
        return _decoder.raw_decode(text)[0]
    except (ValueError, RecursionError):
        return None


class UsageScanner:
    """Finds the usage objects of one `UsageShape` in raw JSON bytes, last first."""

    __slots__ = ("_containers", "_fields", "_valued")

    def __init__(self, shape: UsageShape) -> None:
        self._containers = tuple(dict.fromkeys(_quoted(p[-1]) for p in shape.containers if p))
        root = () in shape.containers
        self._fields = tuple((f, _quoted(f)) for f in shape.fields) if root else ()
        # One regex search is the cheapest "is there a usage key with a non-null value?": a
        # literal prefix lets the engine skip ahead, and OpenAI-style streams repeat
        # `"usage":null` on every chunk. The lookahead refuses `n` (a JSON value starting with
        # n is null) and blanks, so that backtracking cannot stop short of the value.
        keys = self._containers or tuple(key for _, key in self._fields)
        alternatives = b"|".join(re.escape(key) for key in keys)
        self._valued = re.compile(b"(?:%s)[ \t\r\n]*:[ \t\r\n]*(?![ \t\r\nn])" % alternatives)

    def has_value(self, data: bytes) -> bool:
        """Whether `data` holds a usage key with a non-null value (maybe a usage object)."""
        return self._valued.search(data) is not None

    def objects(self, data: bytes) -> Iterator[dict[str, object]]:
        """Candidate usage objects: for each container key, its occurrences from the last one
        back; for a root container (Ollama), the last value of each count field."""
        for key in self._containers:
            end = len(data)
            for _ in range(_MAX_TRIES):
                at = data.rfind(key, 0, end)
                if at < 0:
                    break
                value = value_after(data, at + len(key))
                if isinstance(value, dict):
                    yield value
                end = at
        node: dict[str, object] = {}
        for field, key in self._fields:
            at = data.rfind(key)
            if at >= 0:
                node[field] = value_after(data, at + len(key))
        if node:
            yield node


@lru_cache(maxsize=128)
def scanner_for(shape: UsageShape) -> UsageScanner:
    """Shapes are few and immutable: build each scanner (and its regex) once."""
    return UsageScanner(shape)
