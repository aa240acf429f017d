"""The failure-loop breaker: the same call failing, or repeated, again and again.

A stuck agent repeats one call: the same request, failing the same way, each too cheap for a
rate or a budget to notice. This module is the rule (``_stores/lua/_lib.lua`` is its twin,
held to it by ``tests/stores/test_loops_differential.py``) and the fingerprint that names a
call. ``docs/guards.md#failure-loop-breaker`` is the user's view.

**Fingerprint.** A call is named by a keyed hash (HMAC-SHA256 under the deployment secret,
64 bits as 16 hex characters) of its method, host, path and *normalised* body: the JSON body
with the fields that change between two sends of the same request dropped (``VOLATILE``,
``ID_FIELDS``) and its keys sorted; message text, tool calls and their arguments are kept.
A body that is not JSON, or larger than ``PARSE_LIMIT``, is hashed as bytes (at most
``HASH_LIMIT`` of them, and its length). No body is ever stored: only the hash.

**State.** Per identity, at most ``max_calls`` recent calls (``LoopCall``), each with its
fingerprint, its sends in the repeat window, its failures in the failure window and, once it
tripped, until when it is refused and how often it tripped lately. A call untouched for
longer than both windows (neither refused nor tripped within ``ESCALATION_WINDOW``) is
forgotten; a new call in a full table replaces the least recently seen one that is not
refused (or, when all are, the least recently seen).

**Rules.**

* ``check`` (before a call): a refused call (``open_until > now``) is refused again
  (``failure_loop``). Otherwise it counts as a send: the ``repeats``-th send within
  ``repeat_window`` of the first is a *repeat loop*, reported once per window
  (``repeated``), or, with ``refuse_repeats``, refused (``repeat_loop``) with nothing counted
  until the window has passed. ``count=False`` asks only "is this call refused?": nothing
  is counted or changed (the send is counted after the call, by ``note(send=True)``).
* ``note`` (after it): with ``send``, the call first counts as a send, as ``check`` counts
  one (a repeat loop is then reported, never refused: the call went out already). A failure
  counts within ``failure_window`` of the first failure; the ``failures``-th trips: the call
  is refused for ``cooldown`` seconds, doubled for each further trip of the same call within
  ``ESCALATION_WINDOW`` of the previous one (at most ``cooldown_max``), after which its count
  starts again from nothing. A success ends the failure count (not a refusal in force); an
  outcome of None (an SDK's retry of a call whose failure counted already) counts neither.
"""

from __future__ import annotations

import functools
import hashlib
import json
import json.encoder
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._errors import ConfigurationError

__all__ = [
    "FINGERPRINT_LENGTH",
    "HASH_LIMIT",
    "ID_FIELDS",
    "LOOP_REASONS",
    "PARSE_LIMIT",
    "VOLATILE",
    "LoopCall",
    "LoopPolicy",
    "LoopState",
    "LoopVerdict",
    "check",
    "clean_error",
    "fingerprint",
    "forget",
    "normalised",
    "note",
    "parsed_body",
]

#: Hex characters of a fingerprint (64 bits: collisions within one identity's 16 calls are
#: out of reach).
FINGERPRINT_LENGTH = 16
#: Bodies up to this size are parsed as JSON and normalised; larger ones are hashed as bytes.
PARSE_LIMIT = 1 << 20
#: At most this many bytes of a body are hashed (with the body's length).
HASH_LIMIT = 4 << 20
#: The longest error description kept (``clean_error``).
ERROR_LENGTH = 32
#: A trip this soon after the same call's previous one doubles its cooldown (as the velocity
#: latch's ``escalation_window``); a call that tripped this recently is remembered.
ESCALATION_WINDOW = 3_600.0
#: Doublings at the most (the cooldown is capped long before: this only bounds the number).
MAX_STRIKES = 32.0

#: Top-level request fields that differ between two sends of the same call, or do not change
#: what is asked: dropped from the fingerprint.
VOLATILE = frozenset(
    {
        "stream",  # the same call, streamed or not
        "stream_options",
        "user",
        "metadata",
        "seed",
        "store",
        "service_tier",
        "request_id",
        "idempotency_key",
        "previous_response_id",  # a new one with each reply: the loop would hide behind it
        "prompt_cache_key",
        "safety_identifier",
        "timestamp",
        "created",
        "created_at",
    }
)
#: Fields dropped from each message or input item, its content blocks and its tool calls:
#: ids a provider makes anew for each reply, and cache hints a framework moves each turn.
#: Tool-call *arguments* are kept whole (their own ``id`` fields included).
ID_FIELDS = frozenset({"id", "tool_call_id", "call_id", "tool_use_id", "cache_control"})
_ITEM_LISTS = ("messages", "input", "contents")
_ITEMS = frozenset(_ITEM_LISTS)
_NESTED_LISTS = ("content", "tool_calls")

#: Refusal reasons (``LoopVerdict.reason``), coded as the Lua replies them.
LOOP_REASONS = {1: "failure_loop", 2: "repeat_loop"}
_FAILURE, _REPEAT = 1, 2


# -- fingerprints -------------------------------------------------------------------------------


def _without_ids(part: Any) -> Any:
    """A dict without its ``ID_FIELDS`` (the dict itself when it has none: nothing to copy)."""
    if not isinstance(part, dict) or ID_FIELDS.isdisjoint(part):
        return part
    return {key: value for key, value in part.items() if key not in ID_FIELDS}


def _strip(item: Any) -> Any:
    """A message or item without its ids, nor those of its content blocks and tool calls.

    Only what holds an id is copied: most messages and blocks have none, and are kept as
    they are (the canonical JSON of a dict and of its copy is the same)."""
    kept = _without_ids(item)
    if not isinstance(kept, dict):
        return kept
    for name in _NESTED_LISTS:
        nested = kept.get(name)
        if isinstance(nested, list) and nested:
            stripped = [_without_ids(part) for part in nested]
            if stripped != nested:  # a part lost its ids (the same parts: one C comparison)
                if kept is item:
                    kept = dict(item)
                kept[name] = stripped
    return kept


def normalised(body: Any) -> Any:
    """The parts of a parsed JSON body that name the call (see the module's docstring).

    As ``_strip``, only what loses a part is copied: a body with no volatile field whose
    items hold no id is itself."""
    if not isinstance(body, dict):
        return body
    kept = body
    if not VOLATILE.isdisjoint(body):
        kept = {key: value for key, value in body.items() if key not in VOLATILE}
    if _ITEMS.isdisjoint(kept):  # no history to strip (an embedding, a plain completion)
        return kept
    for name in _ITEM_LISTS:
        items = kept.get(name)
        if isinstance(items, list):
            stripped = [_strip(item) for item in items]
            if stripped != items:  # an item lost its ids (the same items: one C comparison)
                if kept is body:
                    kept = dict(body)
                kept[name] = stripped
    return kept


#: ``json.loads``'s scan, without the steps around it (``_loads``): the decoder's scanner
#: itself, as ``JSONDecoder.raw_decode`` calls it (a Python frame less per body).
_SCAN: Callable[[str, int], tuple[Any, int]]
_SCAN = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # set by its __init__
#: What JSON counts as whitespace (``json.decoder.WHITESPACE``).
_JSON_SPACE = " \t\n\r"


def _loads(body: bytes) -> Any:
    """``json.loads(body)``: the same value, or the same failure (a ``ValueError``).

    An object's opening brace followed by no NUL is UTF-8 to ``loads``'s detection (UTF-16
    and UTF-32 put NULs beside ASCII characters): such a body is decoded here as ``loads``
    would decode it, and scanned from its brace, without the Python-level steps around the
    scan (the detection, the type checks, the regular expressions skipping whitespace before
    the value and after it). Anything else goes to ``loads`` as it is."""
    if body[:1] != b"{" or body[1:2] == b"\0":
        return json.loads(body)
    text = body.decode("utf-8", "surrogatepass")
    try:
        value, end = _SCAN(text, 0)  # starts with its value: no whitespace to skip
    except StopIteration as err:  # no value at 0 (never after a brace): as ``raw_decode``
        raise json.JSONDecodeError("Expecting value", text, err.value) from None
    if end != len(text) and text[end:].strip(_JSON_SPACE):
        raise ValueError("Extra data")  # more than whitespace after the value, as ``loads``
    return value


def parsed_body(body: bytes | None) -> tuple[bool, Any]:
    """``(True, value)`` for a JSON body within ``PARSE_LIMIT``, else ``(False, None)``: the
    one parse that the fingerprint and the tool-history check share. Never raises."""
    if not body or len(body) > PARSE_LIMIT:
        return False, None
    try:
        return True, _loads(body)
    except (ValueError, TypeError, RecursionError):
        return False, None


#: Canonical JSON: keys sorted, no spaces, text as it is. Made once (``json.dumps`` would make
#: an encoder per call); no check for cycles, as a parsed body has none.
_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, check_circular=False
)


def _c_encoder() -> Callable[[Any, int], Sequence[str]] | None:
    """``_CANONICAL``'s C encoder, made once: ``encode`` makes one per call (as ``iterencode``
    does, with these arguments), a few thousand instructions. None without the accelerator."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    encoder: Callable[[Any, int], Sequence[str]] = make(
        None,  # no markers: no check for cycles
        _CANONICAL.default,
        json.encoder.encode_basestring,  # ensure_ascii=False
        None,  # no indent
        _CANONICAL.key_separator,
        _CANONICAL.item_separator,
        _CANONICAL.sort_keys,
        _CANONICAL.skipkeys,
        _CANONICAL.allow_nan,
    )
    return encoder


_ENCODER = _c_encoder()


def _canonical_text(value: Any) -> str:
    """``_CANONICAL.encode(value)``: the same text (``tests/core/test_loops.py`` holds it)."""
    if _ENCODER is None:
        return _CANONICAL.encode(value)
    return "".join(_ENCODER(value, 0))


def _canonical(parsed: Any) -> bytes | None:
    """The normalised body as canonical JSON, or None when it cannot be written back."""
    try:
        text = _canonical_text(normalised(parsed))
    except (ValueError, TypeError, RecursionError):
        return None
    return text.encode("utf-8", "surrogatepass")


#: HMAC's paddings (RFC 2104), as ``bytes.translate`` tables, and SHA-256's block size.
_IPAD = bytes(byte ^ 0x36 for byte in range(256))
_OPAD = bytes(byte ^ 0x5C for byte in range(256))
_BLOCK = 64


@functools.lru_cache(maxsize=16)
def _keyed(secret: bytes) -> tuple[hashlib._Hash, hashlib._Hash]:
    """HMAC-SHA256 keyed with ``secret``, as the inner and outer SHA-256 states after their
    padded keys (RFC 2104, as ``hmac`` builds it): copied per call, the key's setup is paid
    once. ``hmac.HMAC.copy`` and its digest copy OpenSSL's three HMAC contexts each time:
    some 6k instructions a call more than this (``tests/core/test_loops.py`` holds the two
    equal)."""
    key = hashlib.sha256(secret).digest() if len(secret) > _BLOCK else secret
    key = key.ljust(_BLOCK, b"\0")
    return hashlib.sha256(key.translate(_IPAD)), hashlib.sha256(key.translate(_OPAD))


@functools.lru_cache(maxsize=256)
def _headed(
    secret: bytes, method: str, host: str, path: str
) -> tuple[hashlib._Hash, hashlib._Hash]:
    """``_keyed(secret)``'s inner state after the call's first line (method, host, path), and
    its outer state. A client calls a few endpoints again and again: the line is made and
    hashed once per endpoint, not per call (bounded: a path may carry an id)."""
    inner, outer = _keyed(secret)
    mac = inner.copy()
    mac.update(f"{method.upper()} {host.lower()} {path}\n".encode("utf-8", "surrogatepass"))
    return mac, outer


def fingerprint(
    secret: bytes,
    method: str,
    host: str,
    path: str,
    body: bytes | None,
    parsed: tuple[bool, Any] | None = None,
) -> str:
    """The call's fingerprint: 16 hex characters, keyed with ``secret``. Never raises.

    ``parsed`` is ``parsed_body(body)`` when the caller has it already."""
    if not body:
        return _bodiless(secret, method, host, path)
    head, outer = _headed(secret, method, host, path)
    mac = head.copy()
    is_json, value = parsed if parsed is not None else parsed_body(body)
    canonical = _canonical(value) if is_json else None
    if canonical is not None:
        mac.update(b"json\n")
        mac.update(canonical)
    else:
        mac.update(b"bytes %d\n" % len(body))
        mac.update(body[:HASH_LIMIT])
    return _finished(mac, outer)


@functools.lru_cache(maxsize=256)
def _bodiless(secret: bytes, method: str, host: str, path: str) -> str:
    """The fingerprint of a call without a body: its first line alone. A ``GET`` (or a
    bodiless ``POST``) that a client polls is the same call every time: hashed once per
    endpoint, as ``_headed`` is, not per call (bounded the same way)."""
    head, outer = _headed(secret, method, host, path)
    return _finished(head.copy(), outer)


def _finished(mac: hashlib._Hash, outer: hashlib._Hash) -> str:
    """HMAC's outer hash over the inner one (``mac``), cut to the fingerprint's length."""
    keyed = outer.copy()
    keyed.update(mac.digest())
    # The digest's first bytes in hex: ``hexdigest()[:16]``, without writing out the rest.
    return keyed.digest()[: FINGERPRINT_LENGTH // 2].hex()


_UNSAFE = re.compile(r"[^A-Za-z0-9_.:/-]+")


def clean_error(text: str) -> str:
    """An error type or code fit to keep and show: safe characters only, at most
    ``ERROR_LENGTH`` of them (an error *type*, never a message, which may quote the input)."""
    return _UNSAFE.sub("_", text)[:ERROR_LENGTH].strip("_")


# -- the rule -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LoopPolicy:
    """When the same call is a loop (``FailureLoopPolicy`` is the public face of it)."""

    failures: int = 3
    """Failures of the same call within ``failure_window`` that trip it."""
    failure_window: float = 120.0
    cooldown: float = 120.0
    """Seconds a tripped call is refused; then it starts again from nothing."""
    cooldown_max: float = 3_600.0
    """The longest cooldown, however often the call trips again within the hour."""
    repeats: int = 5
    """Sends of the same call within ``repeat_window`` that make a repeat loop."""
    repeat_window: float = 60.0
    refuse_repeats: bool = False
    """Refuse a repeat loop (else it is reported, as an event, and let through)."""
    max_calls: int = 16
    """Calls remembered per identity."""
    keep: float = field(init=False, repr=False, compare=False)
    """How long an untouched call that neither is refused nor tripped within
    ``ESCALATION_WINDOW`` is remembered: the longer window. Worked out once, with the policy
    (every check and note reads it)."""

    def __post_init__(self) -> None:
        for name, least in (("failures", 2), ("repeats", 2), ("max_calls", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= 1000:
                raise ConfigurationError(
                    f"{name} must be an integer from {least} to 1000, not {value!r}"
                )
        for name in ("failure_window", "repeat_window", "cooldown", "cooldown_max"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not (math.isfinite(value) and 0 < value <= 86_400)
            ):
                raise ConfigurationError(
                    f"{name} must be a number of seconds above 0 and at most a day, not {value!r}"
                )
        if self.cooldown_max < self.cooldown:
            raise ConfigurationError(
                f"cooldown_max ({self.cooldown_max!r}) must be at least cooldown "
                f"({self.cooldown!r})"
            )
        if not isinstance(self.refuse_repeats, bool):
            raise ConfigurationError(
                f"refuse_repeats must be True or False, not {self.refuse_repeats!r}"
            )
        keep = max(float(self.failure_window), float(self.repeat_window))
        object.__setattr__(self, "keep", keep)


@dataclass(slots=True)
class LoopCall:
    """One recent call of an identity. Counts are whole numbers kept as floats, as in Redis."""

    fingerprint: str
    last_seen: float
    sends: float = 0.0
    sends_since: float = 0.0
    failures: float = 0.0
    failures_since: float = 0.0
    open_until: float = 0.0
    status: float = 0.0
    """The HTTP status of the last failure (0: none, or not HTTP)."""
    error: str = ""
    """The type of the last failure (``clean_error``)."""
    strikes: float = 0.0
    """Trips of this call in a row, each within ``ESCALATION_WINDOW`` of the previous one."""
    last_trip: float = 0.0


@dataclass(slots=True)
class LoopState:
    """An identity's recent calls, oldest first (new calls are appended)."""

    calls: list[LoopCall] = field(default_factory=list)


@dataclass(slots=True)
class LoopVerdict:
    """What ``check`` or ``note`` found.

    ``reason`` names the refusal (``failure_loop``, ``repeat_loop``), or with ``allowed`` a
    call that ``repeated`` (reached ``repeats`` this send) or ``tripped`` (this failure
    reached ``failures``). ``count`` is the failures (or sends, for a repeat) counted in
    ``window`` seconds; ``failures`` the failures counted so far, so that a success needs
    noting only when there are some to end.
    """

    allowed: bool = True
    reason: str | None = None
    tripped: bool = False
    repeated: bool = False
    count: float = 0.0
    window: float = 0.0
    retry_after: float = 0.0
    failures: float = 0.0
    status: float = 0.0
    error: str = ""


def _kept(call: LoopCall, now: float, keep: float) -> bool:
    return (
        now - call.last_seen <= keep
        or call.open_until > now
        or (call.last_trip > 0 and now - call.last_trip <= ESCALATION_WINDOW)
    )


def _prune(state: LoopState, now: float, p: LoopPolicy) -> None:
    """Forget the calls untouched for longer than both windows, neither refused nor tripped
    within ``ESCALATION_WINDOW``."""
    keep = p.keep
    for call in state.calls:
        # A call seen within ``keep`` is kept (most are): the list is made again only when
        # a call goes.
        if now - call.last_seen > keep and not _kept(call, now, keep):
            state.calls = [kept for kept in state.calls if _kept(kept, now, keep)]
            return


def _find(state: LoopState, fingerprint: str) -> LoopCall | None:
    for call in state.calls:
        if call.fingerprint == fingerprint:
            return call
    return None


def _evict(state: LoopState, now: float) -> None:
    """Drop the least recently seen call that is not refused, else the least recently seen."""
    calls = state.calls
    victim = -1
    for at, call in enumerate(calls):
        if call.open_until <= now and (victim < 0 or call.last_seen < calls[victim].last_seen):
            victim = at
    if victim < 0:
        victim = 0
        for at, call in enumerate(state.calls):
            if call.last_seen < state.calls[victim].last_seen:
                victim = at
    del state.calls[victim]


def _call(state: LoopState, fingerprint: str, now: float, p: LoopPolicy) -> LoopCall:
    """The call's record, a new one if it has none (making room first)."""
    call = _find(state, fingerprint)
    if call is None:
        while len(state.calls) >= p.max_calls:
            _evict(state, now)
        call = LoopCall(fingerprint, now)
        state.calls.append(call)
    return call


def _cooled(call: LoopCall, now: float) -> None:
    """A trip whose cooldown is over: the call starts again from nothing."""
    if 0 < call.open_until <= now:
        call.open_until = 0.0
        call.failures = 0.0
        call.failures_since = 0.0


def _refused(call: LoopCall, now: float, p: LoopPolicy) -> LoopVerdict:
    return LoopVerdict(
        allowed=False,
        reason=LOOP_REASONS[_FAILURE],
        count=call.failures,
        window=float(p.failure_window),
        retry_after=call.open_until - now,
        failures=call.failures,
        status=call.status,
        error=call.error,
    )


def _new_sends(call: LoopCall, now: float, p: LoopPolicy) -> None:
    """Start the call's repeat window again when it has passed (or never began)."""
    if call.sends <= 0 or now - call.sends_since > p.repeat_window:
        call.sends = 0.0
        call.sends_since = now


def _peek(state: LoopState, fingerprint: str, now: float, p: LoopPolicy) -> LoopVerdict:
    """``check`` with ``count=False``: the refusal of a refused call, else allowed (with the
    failures counted so far); nothing is changed, nothing is pruned, nothing is made."""
    call = _find(state, fingerprint)
    if call is None or not _kept(call, now, p.keep):
        return LoopVerdict()
    if call.open_until > now:
        return _refused(call, now, p)
    if call.open_until > 0:  # its cooldown is over: its count starts again from nothing
        return LoopVerdict()
    return LoopVerdict(failures=call.failures)  # as a store's view answers (``open_keys``)


def check(
    state: LoopState, fingerprint: str, now: float, p: LoopPolicy, count: bool = True
) -> LoopVerdict:
    """Before a call: refuse a tripped call, count a send, find a repeat loop. ``count=False``:
    only refuse a tripped call (``_peek``)."""
    if not count:
        return _peek(state, fingerprint, now, p)
    _prune(state, now, p)
    call = _call(state, fingerprint, now, p)
    call.last_seen = now
    _cooled(call, now)
    if call.open_until > now:
        return _refused(call, now, p)
    _new_sends(call, now, p)
    if call.sends + 1 >= p.repeats and p.refuse_repeats:
        return LoopVerdict(
            allowed=False,
            reason=LOOP_REASONS[_REPEAT],
            count=call.sends + 1,
            window=float(p.repeat_window),
            retry_after=call.sends_since + p.repeat_window - now,
            failures=call.failures,
            status=call.status,
            error=call.error,
        )
    call.sends = call.sends + 1
    return LoopVerdict(
        repeated=call.sends == p.repeats,
        count=call.sends,
        window=float(p.repeat_window),
        failures=call.failures,
        status=call.status,
        error=call.error,
    )


def note(
    state: LoopState,
    fingerprint: str,
    failed: bool | None,
    status: float,
    error: str,
    now: float,
    p: LoopPolicy,
    send: bool = False,
) -> LoopVerdict:
    """After a call: count it as a send first (``send``: its check counted none), then count
    its failure (the ``failures``-th trips it) or end its failures (``failed`` None: neither).

    The verdict is the trip's, else the repeat's (``count`` its sends, in ``repeat_window``),
    else the failure count's; ``repeated`` is set whenever this send made a repeat loop."""
    _prune(state, now, p)
    call = _call(state, fingerprint, now, p)
    call.last_seen = now
    _cooled(call, now)
    repeated = False
    if send:
        _new_sends(call, now, p)
        call.sends = call.sends + 1
        repeated = call.sends == p.repeats
    if not failed:
        if failed is not None and call.open_until <= 0:  # a refusal in force keeps its count
            call.failures = 0.0
            call.failures_since = 0.0
        if repeated:
            return LoopVerdict(
                repeated=True, count=call.sends, window=float(p.repeat_window),
                failures=call.failures, status=call.status, error=call.error,
            )  # fmt: skip
        return LoopVerdict()
    if call.failures <= 0 or now - call.failures_since > p.failure_window:
        call.failures = 0.0
        call.failures_since = now
    call.failures = call.failures + 1
    call.status = status
    call.error = error
    if call.failures >= p.failures and call.open_until <= 0:
        if call.last_trip > 0 and now - call.last_trip <= ESCALATION_WINDOW:
            call.strikes = min(call.strikes + 1, MAX_STRIKES)
        else:
            call.strikes = 0.0
        call.last_trip = now
        call.open_until = now + min(p.cooldown * 2.0**call.strikes, p.cooldown_max)
        verdict = _refused(call, now, p)
        verdict.allowed = True  # this call was sent; the next one is refused
        verdict.tripped = True
        verdict.repeated = repeated
        return verdict
    return LoopVerdict(
        repeated=repeated,
        count=call.sends if repeated else call.failures,
        window=float(p.repeat_window if repeated else p.failure_window),
        failures=call.failures,
        status=status,
        error=error,
    )


def forget(state: LoopState, fingerprint: str) -> None:
    """Forget one call (``fingerprint``), or every call (``""``): an operator's reset."""
    if fingerprint:
        state.calls = [call for call in state.calls if call.fingerprint != fingerprint]
    else:
        state.calls = []
