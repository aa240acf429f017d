"""The failure-loop rule and the fingerprint, each stated on its own, on a simulated clock."""

from __future__ import annotations

import hashlib
import hmac
import json
import random

import pytest

from tokenfuse._core import loops
from tokenfuse._core.loops import LoopPolicy, LoopState, check, fingerprint, forget, note
from tokenfuse._errors import ConfigurationError

SECRET = b"a test secret, 32 characters...."
NOW = 1_767_225_600.0
A, B = "0123456789abcdef", "fedcba9876543210"


def fail(state: LoopState, mark: str, now: float, p: LoopPolicy) -> loops.LoopVerdict:
    assert check(state, mark, now, p).allowed
    return note(state, mark, True, 400.0, "invalid_request_error", now, p)


def test_the_third_failure_within_the_window_trips_and_the_next_call_is_refused() -> None:
    p, state = LoopPolicy(), LoopState()
    assert not fail(state, A, NOW, p).tripped
    assert not fail(state, A, NOW + 50, p).tripped
    third = fail(state, A, NOW + 100, p)
    assert third.tripped and third.allowed and third.count == 3
    refused = check(state, A, NOW + 101, p)
    assert not refused.allowed and refused.reason == "failure_loop"
    assert refused.count == 3 and refused.window == 120
    assert refused.retry_after == pytest.approx(119)
    assert refused.status == 400 and refused.error == "invalid_request_error"
    assert check(state, B, NOW + 101, p).allowed  # another call is progress, not the loop


def test_failures_further_apart_than_the_window_do_not_trip() -> None:
    p, state = LoopPolicy(), LoopState()
    for at in (0, 100, 121, 200, 242, 320):  # never three within 120 s of the first
        assert not fail(state, A, NOW + at, p).tripped


def test_a_success_ends_the_count() -> None:
    p, state = LoopPolicy(), LoopState()
    fail(state, A, NOW, p)
    fail(state, A, NOW + 1, p)
    check(state, A, NOW + 2, p)
    note(state, A, False, 200.0, "", NOW + 2, p)
    assert not fail(state, A, NOW + 3, p).tripped
    assert fail(state, A, NOW + 4, p).count == 2


def test_after_the_cooldown_the_call_starts_from_nothing() -> None:
    p, state = LoopPolicy(cooldown=30), LoopState()
    for at in (0, 1, 2):
        fail(state, A, NOW + at, p)
    assert not check(state, A, NOW + 31.9, p).allowed
    assert check(state, A, NOW + 32, p).allowed  # exactly at open_until: allowed
    assert note(state, A, True, 500.0, "", NOW + 32, p).count == 1


def test_a_call_that_trips_again_within_the_hour_waits_twice_as_long_up_to_the_cap() -> None:
    p, state = LoopPolicy(cooldown=30, cooldown_max=100), LoopState()
    now = NOW
    waits = []
    for _ in range(4):  # trip, wait it out, trip again at once
        for _ in range(3):
            fail(state, A, now, p)
        refused = check(state, A, now, p)
        waits.append(refused.retry_after)
        now += refused.retry_after
    assert waits == [30, 60, 100, 100]
    now += 3_600.5  # a quiet hour: the escalation is forgotten
    for _ in range(3):
        fail(state, A, now, p)
    assert check(state, A, now, p).retry_after == 30


def test_five_identical_sends_within_a_minute_are_reported_once() -> None:
    p, state = LoopPolicy(), LoopState()
    seen = [check(state, A, NOW + at, p) for at in range(0, 60, 10)]
    assert [v.repeated for v in seen] == [False, False, False, False, True, False]
    assert all(v.allowed for v in seen)
    assert check(state, A, NOW + 200, p).count == 1  # a new window


def test_refused_repeats_refuse_the_fifth_send_until_the_window_has_passed() -> None:
    p, state = LoopPolicy(refuse_repeats=True), LoopState()
    for at in range(4):
        assert check(state, A, NOW + at, p).allowed
    fifth = check(state, A, NOW + 4, p)
    assert not fifth.allowed and fifth.reason == "repeat_loop" and fifth.count == 5
    assert fifth.retry_after == pytest.approx(56)
    assert not check(state, A, NOW + 59, p).allowed
    assert check(state, A, NOW + 60.5, p).allowed


def test_the_table_is_bounded_and_keeps_the_refused_calls() -> None:
    p, state = LoopPolicy(max_calls=3, failures=2), LoopState()
    fail(state, "f" * 16, NOW, p)
    fail(state, "f" * 16, NOW, p)  # tripped: refused for 120 s
    for i in range(50):
        check(state, f"{i:016x}", NOW + 1 + i / 100, p)
    assert len(state.calls) == 3
    assert not check(state, "f" * 16, NOW + 2, p).allowed


def test_calls_untouched_past_both_windows_are_forgotten() -> None:
    p, state = LoopPolicy(), LoopState()
    check(state, A, NOW, p)
    check(state, B, NOW + 200, p)
    assert [call.fingerprint for call in state.calls] == [B]


def test_forget_one_or_all() -> None:
    p, state = LoopPolicy(failures=2), LoopState()
    for mark in (A, B):
        fail(state, mark, NOW, p)
        fail(state, mark, NOW, p)
    forget(state, A)
    assert check(state, A, NOW + 1, p).allowed and not check(state, B, NOW + 1, p).allowed
    forget(state, "")
    assert check(state, B, NOW + 1, p).allowed


@pytest.mark.parametrize(
    "bad",
    [
        {"failures": 1},
        {"failures": True},
        {"repeats": 2.5},
        {"max_calls": 0},
        {"failure_window": 0},
        {"cooldown": float("nan")},
        {"repeat_window": 10 * 86_400},
        {"refuse_repeats": "yes"},
        {"cooldown": 60, "cooldown_max": 30},
    ],
)
def test_bad_policies_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        LoopPolicy(**bad)  # type: ignore[arg-type]


# -- fingerprints --------------------------------------------------------------------------------


def mark(body: object, path: str = "/v1/chat/completions") -> str:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return fingerprint(SECRET, "POST", "api.openai.com", path, raw)


CHAT = {
    "model": "gpt-4o",
    "messages": [
        {"role": "user", "content": "weather in Paris?"},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "error: timeout"},
    ],
}


def test_volatile_fields_ids_and_key_order_do_not_change_the_fingerprint() -> None:
    same = json.loads(json.dumps(CHAT))
    same.update(stream=True, stream_options={"include_usage": True}, user="u-9", seed=7)
    same["metadata"] = {"run": "x"}
    same["messages"][1]["tool_calls"][0]["id"] = "call_2"
    same["messages"][2]["tool_call_id"] = "call_2"
    reordered = dict(reversed(list(same.items())))
    assert mark(reordered) == mark(CHAT)
    assert len(mark(CHAT)) == 16 and int(mark(CHAT), 16) >= 0


@pytest.mark.parametrize(
    "change",
    [
        lambda b: b["messages"].append({"role": "user", "content": "and Rome?"}),
        lambda b: b["messages"][1]["tool_calls"][0]["function"].update(arguments='{"city":"Rome"}'),
        lambda b: b["messages"][0].update(content="weather in Rome?"),
        lambda b: b.update(model="gpt-4o-mini"),
    ],
)
def test_what_the_call_asks_changes_the_fingerprint(change: object) -> None:
    other = json.loads(json.dumps(CHAT))
    change(other)  # type: ignore[operator]
    assert mark(other) != mark(CHAT)


def test_path_method_and_secret_are_part_of_it() -> None:
    body = json.dumps(CHAT).encode()
    base = fingerprint(SECRET, "POST", "api.openai.com", "/v1/chat/completions", body)
    assert base != fingerprint(SECRET, "POST", "api.openai.com", "/v1/responses", body)
    assert base != fingerprint(SECRET, "PUT", "api.openai.com", "/v1/chat/completions", body)
    assert base != fingerprint(b"x" * 32, "POST", "api.openai.com", "/v1/chat/completions", body)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json at all \xff\xfe",
        b"[1, 2, 3]",
        b'"a string"',
        b"[" * 100_000 + b"]" * 100_000,  # deeper than the parser goes
        b'{"a": NaN}',
        b'{"text": "\\ud800"}',  # a lone surrogate
        b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # an object too deep to parse
        b"x" * (loops.PARSE_LIMIT + 1),
    ],
)
def test_bad_and_huge_bodies_get_a_fingerprint_and_never_raise(body: bytes) -> None:
    first = fingerprint(SECRET, "POST", "h", "/p", body)
    assert len(first) == 16 and first == fingerprint(SECRET, "POST", "h", "/p", body)


def test_bodies_past_the_parse_limit_are_hashed_as_bytes_with_their_length() -> None:
    big = b'{"a": "' + b"x" * loops.PARSE_LIMIT + b'"}'
    assert mark(big) != mark(big[:-2] + b'y"}')  # the bytes count


def _copied_whole(body: object) -> object:
    """The normalisation written plainly (every message and block copied), to hold the
    fingerprint's (which copies only what holds an id) to it."""

    def bare(part: object) -> object:
        if not isinstance(part, dict):
            return part
        return {key: value for key, value in part.items() if key not in loops.ID_FIELDS}

    def strip(item: object) -> object:
        kept = bare(item)
        if isinstance(kept, dict):
            for name in ("content", "tool_calls"):
                if isinstance(kept.get(name), list):
                    kept[name] = [bare(part) for part in kept[name]]
        return kept

    if not isinstance(body, dict):
        return body
    kept = {key: value for key, value in body.items() if key not in loops.VOLATILE}
    for name in ("messages", "input", "contents"):
        if isinstance(kept.get(name), list):
            kept[name] = [strip(item) for item in kept[name]]
    return kept


def _random_body(rng: random.Random) -> object:
    ids = ["id", "tool_call_id", "call_id", "tool_use_id", "cache_control"]
    fields = [*ids, "role", "content", "text", "name", "arguments", "type"]

    def part() -> object:
        if rng.random() < 0.15:
            return rng.choice(["text", 3, None, ["x"]])
        return {rng.choice(fields): rng.choice(["v", 1, {"id": "kept"}]) for _ in range(3)}

    def item() -> object:
        found = part()
        if isinstance(found, dict) and rng.random() < 0.6:
            found[rng.choice(["content", "tool_calls"])] = [part() for _ in range(3)]
        return found

    body: dict[str, object] = {"model": "m", rng.choice(["stream", "user", "x"]): True}
    for name in rng.sample(["messages", "input", "contents", "tools"], 2):
        body[name] = [item() for _ in range(rng.randint(0, 5))]
    return body


def test_the_fingerprint_normalises_as_copying_everything_would() -> None:
    rng = random.Random(12)
    for _ in range(2_000):
        body = _random_body(rng)
        before = json.dumps(body, sort_keys=True)
        plain = json.dumps(_copied_whole(body), sort_keys=True, separators=(",", ":"))
        assert loops._canonical(body) == plain.encode()
        assert json.dumps(body, sort_keys=True) == before  # the parsed body is left as it was


def test_bodiless_fingerprints_are_kept_per_endpoint_in_bounded_memory() -> None:
    """A call without a body is hashed once per endpoint and kept (``_bodiless``): the
    same fingerprint as hashing it afresh, for ``None`` and ``b""`` alike, and however many
    paths come (ids in them), no more than the cache's bound are kept."""
    loops._bodiless.cache_clear()
    for n in range(1_000):
        path = f"/items/{n}"
        mac = hmac.new(SECRET, f"GET h {path}\n".encode(), hashlib.sha256)
        expected = mac.hexdigest()[: loops.FINGERPRINT_LENGTH]
        assert fingerprint(SECRET, "GET", "h", path, None) == expected
        assert fingerprint(SECRET, "GET", "h", path, b"") == expected
    info = loops._bodiless.cache_info()
    assert info.currsize == info.maxsize == 256
    assert info.hits == 1_000  # the second of each pair


@pytest.mark.parametrize("size", [1, 32, 63, 64, 65, 200])
def test_the_fingerprint_is_hmac_sha256_for_any_secret(size: int) -> None:
    secret = bytes(range(256))[:size]
    bodies = (b"", json.dumps(CHAT).encode(), b"not json", b"x" * 70_000)
    # Twice over, each body after the others: the call's first line is hashed once and kept
    # (``_headed``), and no call may change what the next one starts from.
    for body in bodies + bodies[::-1]:
        mac = hmac.new(secret, digestmod=hashlib.sha256)
        mac.update(b"POST api.openai.com /v1/chat/completions\n")
        if body:
            canonical = loops._canonical(json.loads(body)) if body[:1] == b"{" else None
            if canonical is not None:
                mac.update(b"json\n" + canonical)
            else:
                mac.update(b"bytes %d\n" % len(body) + body)
        expected = mac.hexdigest()[: loops.FINGERPRINT_LENGTH]
        assert fingerprint(secret, "POST", "api.openai.com", "/v1/chat/completions", body) == (
            expected
        )
        # The method and the host are named in any case: the same call.
        assert fingerprint(secret, "post", "API.openai.com", "/v1/chat/completions", body) == (
            expected
        )


@pytest.mark.parametrize(
    "body",
    [
        json.dumps(CHAT).encode(),
        json.dumps({"text": "é ☃ 𝄞"}, ensure_ascii=False).encode(),
        '{"text": "é"}'.encode("utf-16-le"),
        '{"text": "é"}'.encode("utf-16"),
        '{"text": "é"}'.encode("utf-32-le"),
        '{"text": "é"}'.encode("utf-8-sig"),
        b"{",
        b"{\x00",
        b'{"a": "\xff"}',
        b'{"text": "\\ud800"}',
        b" [1]",
        b"{}",
        b'{"a": 1} \r\n\t',  # whitespace after the value
        b'{"a": 1} x',  # more after it
        b'{"a": 1}{}',
        b'{"a": 1}\x0c',  # not JSON's whitespace
        b'{"a": NaN, "b": -Infinity, "c": 1e400}',
        b'{"a": 1,}',
    ],
)
def test_a_body_parses_as_json_loads_parses_it(body: bytes) -> None:
    try:
        expected = (True, json.loads(body))
    except ValueError:
        expected = (False, None)
    assert loops.parsed_body(body) == expected


@pytest.mark.parametrize(
    "value",
    [
        CHAT,
        {"b": [1.5, float("inf"), float("nan"), -0.0, 1e400, 10**30], "a": None, "c": True},
        {"text": "é ☃ 𝄞 \u2028 \x00 \ud800", "": {"z": [], "y": {}}},
        ["top", "level", 1],
        "a string",
        3,
    ],
)
def test_the_canonical_text_is_the_canonical_encoders(value: object) -> None:
    assert loops._canonical_text(value) == loops._CANONICAL.encode(value)


def test_what_canonical_json_cannot_write_back_is_none() -> None:
    assert loops._canonical({"a": {1j}}) is None  # only a body not parsed from JSON has one


def test_clean_error_keeps_a_short_type_only() -> None:
    assert loops.clean_error("invalid_request_error") == "invalid_request_error"
    assert loops.clean_error("tool error: bad\nargs!") == "tool_error:_bad_args"
    assert len(loops.clean_error("x" * 500)) == loops.ERROR_LENGTH
