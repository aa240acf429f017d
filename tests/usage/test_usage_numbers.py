"""Only real counts are counted: no strings, bools, negatives, NaN, infinities or absurd sizes."""

from __future__ import annotations

import pytest

from tokenfuse._usage.model import MAX_COUNT, as_count, header_count

from .samples import JSON, OPENAI, Sample, read

BAD_JSON_NUMBERS = {
    "negative": b"-5",
    "string": b'"12"',
    "nan": b"NaN",
    "infinity": b"Infinity",
    "minus-infinity": b"-Infinity",
    "overflow": b"1e400",
    "huge-int": b"1" + b"0" * 30,
    "too-many-digits": b"9" * 5000,
    "true": b"true",
    "false": b"false",
    "object": b'{"n": 5}',
    "list": b"[5]",
}


@pytest.mark.parametrize("bad", BAD_JSON_NUMBERS.values(), ids=BAD_JSON_NUMBERS.keys())
def test_bad_total_is_ignored_and_the_parts_are_used(bad: bytes) -> None:
    body = b'{"usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": ' + bad + b"}}"
    usage = read(Sample(f"{OPENAI}/v1/chat/completions", JSON, body, 7, "openai"))
    if bad == b"9" * 5000:  # Python refuses to parse such an int at all: malformed
        assert (usage.total, usage.problem) == (None, "malformed JSON")
    else:
        assert (usage.total, usage.problem) == (7, None)


@pytest.mark.parametrize("bad", BAD_JSON_NUMBERS.values(), ids=BAD_JSON_NUMBERS.keys())
def test_bad_counts_everywhere_are_unknown(bad: bytes) -> None:
    body = b'{"usage": {"input_tokens": ' + bad + b', "output_tokens": ' + bad + b"}}"
    usage = read(Sample("https://api.anthropic.com/v1/messages", JSON, body, 0, "anthropic"))
    assert usage.total is None
    assert usage.problem in ("invalid usage numbers ignored", "malformed JSON")


def test_one_bad_part_makes_a_partial_sum() -> None:
    body = b'{"usage": {"input_tokens": 10, "output_tokens": -1}}'
    usage = read(Sample("https://api.anthropic.com/v1/messages", JSON, body, 0, "anthropic"))
    assert (usage.total, usage.partial, usage.problem) == (10, True, "output tokens not reported")


def test_cohere_float_counts() -> None:
    body = b'{"usage": {"tokens": {"input_tokens": 71.0, "output_tokens": 0.5}}}'
    assert read(Sample("https://api.cohere.com/v2/chat", JSON, body, 0, "cohere")).total == 71.5


@pytest.mark.parametrize(
    ("value", "count"),
    [
        (0, 0.0),
        (12, 12.0),
        (1.5, 1.5),
        (MAX_COUNT, MAX_COUNT),
        (MAX_COUNT + 1, None),
        (10**400, None),
        (-1, None),
        (-0.0, 0.0),
        (float("nan"), None),
        (float("inf"), None),
        (True, None),
        (False, None),
        ("12", None),
        (None, None),
    ],
)
def test_as_count(value: object, count: float | None) -> None:
    assert as_count(value) == count


@pytest.mark.parametrize(
    ("value", "count"),
    [
        ("25", 25.0),
        (" 25 ", 25.0),
        ("-5", None),
        ("1.5", None),
        ("", None),
        ("²", None),
        ("9" * 20, None),
        (None, None),
    ],
)
def test_header_count(value: str | None, count: float | None) -> None:
    assert header_count(value) == count
