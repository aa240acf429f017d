"""``redis_codec`` without Redis: the policy encodings it keeps, and the verdicts it reads."""

from __future__ import annotations

import struct

import pytest

from tokenfuse import BucketPolicy, VelocityPolicy
from tokenfuse._core.velocity import VelocityVerdict
from tokenfuse._stores import redis_codec
from tokenfuse._stores.ops import Admit, Record
from tokenfuse._stores.redis_codec import CODECS


def test_each_policy_object_is_encoded_with_its_own_numbers_and_the_encodings_stay_bounded() -> (
    None
):
    policies = [VelocityPolicy(limit=1000.0 + n) for n in range(3 * redis_codec._ENCODED_MAX)]
    for _ in range(2):  # the second pass finds most of them gone, and encodes them again
        for policy in policies:
            (_, _, _, encoded) = CODECS[Record].args(Record("k", 1, policy), "", "1")
            assert struct.unpack_from("<d", encoded)[0] == policy.limit
            assert len(redis_codec._ENCODED) <= redis_codec._ENCODED_MAX


def test_equal_policies_made_apart_encode_alike_and_none_is_no_policy() -> None:
    bucket = BucketPolicy(rate=2.0, capacity=5.0)
    first = CODECS[Admit].args(Admit("k", 1, 0, VelocityPolicy(), bucket), "", "1")
    again = CODECS[Admit].args(
        Admit("k", 1, 0, VelocityPolicy(), BucketPolicy(rate=2.0, capacity=5.0)), "", "1"
    )
    assert first == again
    assert struct.unpack("<4d", first[5])[:2] == (2.0, 5.0)
    assert CODECS[Admit].args(Admit("k", 1, 0, None, None), "", "1")[4:] == (b"", b"")


@pytest.mark.parametrize("text", [b"1 0 0 12.5 100 10 1.25 0 nan", "1 0 0 12.5 100 10 1.25 0 nan"])
def test_an_allowed_verdict_reads_its_rate_limit_baseline_and_multiple(text: bytes | str) -> None:
    verdict = CODECS[Record].result(Record("k", 1, VelocityPolicy()), text)
    assert verdict == VelocityVerdict(
        allowed=True, rate=12.5, limit=100.0, baseline=10.0, multiple=1.25
    )


def test_an_allowed_verdict_without_limit_or_baseline_reads_them_as_none() -> None:
    verdict = CODECS[Record].result(Record("k", 1, VelocityPolicy()), b"1 0 0 7 nan nan nan 0 nan")
    assert verdict == VelocityVerdict(allowed=True, rate=7.0)


def test_a_refusal_reads_every_field() -> None:
    reply = b"0 1 6 900 300 100 9 12.5 600"
    verdict = CODECS[Record].result(Record("k", 1, VelocityPolicy()), reply)
    assert verdict == VelocityVerdict(
        allowed=False,
        tripped=True,
        reason="loop_sustained",
        rate=900.0,
        limit=300.0,
        baseline=100.0,
        multiple=9.0,
        retry_after=12.5,
        window=600.0,
    )
