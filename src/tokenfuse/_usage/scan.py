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
from json import JSONDecoder

from .estimate import TextCounter
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

    __slots__ = ("_containers", "_nulls", "_root_fields", "_valued", "fields", "markers", "text")

    def __init__(self, shape: UsageShape) -> None:
        #: The shape's count fields (`UsageShape.fields`, which builds the tuple anew).
        self.fields = shape.fields
        #: Counts the shape's generated text, for estimates (None: the shape names none).
        self.text = TextCounter(shape.text_keys) if shape.text_keys else None
        #: What else makes a stream record worth reading: an error (``ERROR``, searched apart:
        #: see `ErrorFind`), or the end of the stream (`[DONE]` of OpenAI-style streams, the
        #: shape's end events and keys), each with its probes (`probes_of`).
        self.markers = tuple(
            (marker, probes_of(marker))
            for marker in dict.fromkeys((b"[DONE]", *shape.end_events, *shape.end_keys))
        )
        self._containers = tuple(dict.fromkeys(_quoted(p[-1]) for p in shape.containers if p))
        root = () in shape.containers
        self._root_fields = tuple((f, _quoted(f)) for f in shape.fields) if root else ()
        # One regex search is the cheapest "is there a usage key with a non-null value?": a
        # literal prefix lets the engine skip ahead, and OpenAI-style streams repeat
        # `"usage":null` on every chunk. The lookahead refuses `n` (a JSON value starting with
        # n is null) and blanks, so that backtracking cannot stop short of the value.
        keys = self._containers or tuple(key for _, key in self._root_fields)
        alternatives = b"|".join(re.escape(key) for key in keys)
        self._valued = re.compile(b"(?:%s)[ \t\r\n]*:[ \t\r\n]*(?![ \t\r\nn])" % alternatives)
        self._nulls = tuple((key, key + b":null", key + b": null") for key in keys)

    def has_value(self, data: bytes) -> bool:
        """Whether `data` holds a usage key with a non-null value (maybe a usage object)."""
        return self._valued.search(data) is not None

    def valued_at(self, data: bytes) -> int:
        """Where the first usage key with a non-null value starts in `data` (-1: none).

        The same answer as the regex of `has_value`, for runs of many stream events. When each
        of them repeats `"usage":null`, every key is a place where the regex starts a match
        and fails: most of its cost. Counting the keys and their null forms (a C-level pass
        each) settles such runs without it: if some key has a value, the keys outnumber the
        null forms. (Counts skip overlapping occurrences; an occurrence hidden that way sits
        behind one that is not null either, so the inequality holds.)

        The null form of the first key is counted first: a stream writes all its keys alike
        (``json.dumps`` spaced, most servers compact), so the other form, a pass over the
        data, is mostly not counted at all.
        """
        for key, compact, spaced in self._nulls:
            keys = data.count(key)
            if not keys:
                continue
            spaced_first = data.startswith(spaced, data.find(key))
            likely, other = (spaced, compact) if spaced_first else (compact, spaced)
            nulls = data.count(likely)
            if nulls != keys:
                nulls += data.count(other)
            if nulls == keys - 1 and len(self._nulls) == 1:  # the one key of the shape
                return self._only_valued(data, key, compact, spaced)
            if nulls != keys:
                valued = self._valued.search(data)
                return -1 if valued is None else valued.start()
        return -1

    def _only_valued(self, data: bytes, key: bytes, compact: bytes, spaced: bytes) -> int:
        """`valued_at` when one occurrence of `key` is not in a null form: found from the end.

        An OpenAI-style stream ends with its usage, after a run of `"usage":null`: the regex
        would try every one of those keys on its way there; this steps back over the few
        after it. The one occurrence decides: any other is null. (In JSON, occurrences of a
        quoted key never overlap, so the counts saw them all.)
        """
        end = len(data)
        while True:
            at = data.rfind(key, 0, end)
            if at < 0:
                return -1  # not reached: the counts found one occurrence that is not null
            if not (data.startswith(compact, at) or data.startswith(spaced, at)):
                return at if self._valued.match(data, at) else -1
            end = at

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
        for field, key in self._root_fields:
            at = data.rfind(key)
            if at >= 0:
                node[field] = value_after(data, at + len(key))
        if node:
            yield node


#: The word in every error a stream may report (an ``error`` event, an ``{"error": ...}``
#: payload, a ``"type": "error"`` object): what the usage reader and the failure-loop watch
#: both look for first.
ERROR = b"error"


class ErrorFind:
    """Where ``ERROR`` first is in a batch of a stream, searched once for both who look at it.

    The usage reader and the failure-loop watch are shown the same batch (the same bytes
    object) and both look for ``ERROR``: a C-level pass over the batch each, the costliest
    step of a guarded stream. The first to ask searches, and the answer is kept for the
    object searched, by identity (bytes never change; the object is held meanwhile, so that
    its id cannot pass to another); the second to ask takes it, and the batch is let go (the
    finished stream holds no batch).
    """

    __slots__ = ("_at", "_data")

    def __init__(self) -> None:
        self._data = b""
        self._at = -1

    def at(self, data: bytes) -> int:
        if data is self._data:
            self._data = b""  # both have looked
            return self._at
        self._at = at = data.find(ERROR)
        self._data = data
        return at


#: Probe misses a `probed_find` takes before it searches the rest for the marker itself. A miss
#: costs a few thousand instructions (two calls with arguments), a search of a 32 KiB batch
#: some fifty thousand; a probe that misses this often is in the stream's every event (an
#: OpenAI chunk id holds a given capital in about a third of streams), so the next batches try
#: another (see `Accumulator.first_of_interest`).
PROBE_MISSES = 8


def probes_of(marker: bytes) -> tuple[tuple[bytes, int], ...]:
    """The probes of ``marker``: its upper-case ASCII letters (the first occurrence of each,
    with its offset), bytes that the JSON of a stream rarely holds (its keys and values are
    mostly lower case), so that ``find`` seeks them with ``memchr``, some fifty times faster
    than its search for a word."""
    probes: dict[bytes, int] = {}
    for offset, byte in enumerate(marker):
        if 0x41 <= byte <= 0x5A:  # A-Z
            probes.setdefault(bytes((byte,)), offset)
    return tuple(probes.items())


def probed_find(data: bytes, marker: bytes, probe: bytes, offset: int) -> tuple[int, bool]:
    """``data.find(marker)``, and whether the probe was busy (it missed more than
    ``PROBE_MISSES`` times: a stream that carries it often, whose later batches are better
    searched with another).

    ``marker`` holds ``probe`` at ``offset``: each occurrence of the marker is one of the
    probe's, ``offset`` bytes before it, and they come in the same order, so the first probe
    whose bytes around it are the marker gives the first occurrence. Once the probe misses too
    often, the marker is searched from past the last probe tried (every start before it was
    tried): the answer is exact either way.
    """
    at = data.find(probe, offset)  # one byte: memchr
    misses = 0
    while at >= 0:
        start = at - offset
        if data.startswith(marker, start):
            return start, False
        misses += 1
        if misses > PROBE_MISSES:
            return data.find(marker, start + 1), True
        at = data.find(probe, at + 1)
    return -1, False


_CACHE_SIZE = 128
_scanners: dict[int, tuple[UsageShape, UsageScanner]] = {}


def scanner_for(shape: UsageShape) -> UsageScanner:
    """Shapes are few and immutable: build each scanner (and its regex) once.

    Looked up by identity, not by value: hashing a shape hashes all its fields, which costs
    more than the rest of setting up an accumulator. The entry keeps the shape alive, so that
    its id cannot pass to another one.
    """
    entry = _scanners.get(id(shape))
    if entry is not None and entry[0] is shape:
        return entry[1]
    if len(_scanners) >= _CACHE_SIZE:
        _scanners.clear()
    scanner = UsageScanner(shape)
    _scanners[id(shape)] = (shape, scanner)
    return scanner
