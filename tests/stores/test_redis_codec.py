"""``redis_codec`` without Redis: the policy encodings it keeps, and the verdicts it reads."""

from __future__ import annotations

import math
import struct
from typing import Any

import pytest

from tokenfuse import BucketPolicy, VelocityPolicy
from tokenfuse._core.admission import AdmitVerdict
from tokenfuse._core.bucket import BucketVerdict
from tokenfuse._core.velocity import VelocityVerdict
from tokenfuse._errors import StoreUnavailable
from tokenfuse._stores import redis_codec
from tokenfuse._stores.ops import Admit, Gate, Lease, Record, ReturnLease
from tokenfuse._stores.redis_codec import CODECS


def test_each_policy_object_is_encoded_with_its_own_numbers_and_the_encodings_stay_bounded() -> (
    None
):
    policies = [VelocityPolicy(limit=1000.0 + n) for n in range(3 * redis_codec._ENCODED_MAX)]
    for _ in range(2):  # the second pass finds most of them gone, and encodes them again
        for policy in policies:
            (_, encoded) = CODECS[Record].args(Record("k", 1, policy), "", "1")
            assert struct.unpack_from("<d", encoded)[0] == policy.limit
            assert len(redis_codec._ENCODED) <= redis_codec._ENCODED_MAX


def test_equal_policies_made_apart_encode_alike_and_none_is_no_policy() -> None:
    bucket = BucketPolicy(rate=2.0, capacity=5.0)
    first = CODECS[Admit].args(Admit("k", 1, 0, VelocityPolicy(), bucket), "", "1")
    again = CODECS[Admit].args(
        Admit("k", 1, 0, VelocityPolicy(), BucketPolicy(rate=2.0, capacity=5.0)), "", "1"
    )
    assert first == again
    assert struct.unpack("<4d", first[2])[:2] == (2.0, 5.0)
    assert CODECS[Admit].args(Admit("k", 1, 0, None, None), "", "1")[1:] == (b"", b"")


def test_a_decisions_own_numbers_travel_as_one_argument_of_exact_doubles() -> None:
    """now (-1: the server's clock), the TTL in milliseconds, then the amounts."""
    (call, _) = CODECS[Record].args(Record("k", 0.1, VelocityPolicy()), "", "1209600000")
    assert struct.unpack("<3d", call) == (-1.0, 1209600000.0, 0.1)
    now = repr(1767225600.123456)
    (call, _, _) = CODECS[Admit].args(Admit("k", 2.5, 1 / 3, None, None), now, "5")
    assert struct.unpack("<4d", call) == (1767225600.123456, 5.0, 2.5, 1 / 3)


NAN = math.nan


def packed(*numbers: float) -> bytes:
    return struct.pack(f"<{len(numbers)}d", *numbers)


RECORD = Record("k", 1, VelocityPolicy())
REFUSAL = packed(0, 1, 6, 900, 300, 100, 9, 12.5, 600)


def test_an_allowed_record_reads_its_rate_limit_baseline_and_multiple() -> None:
    verdict = CODECS[Record].result(RECORD, packed(1, 12.5, 100, 10, 1.25))
    assert verdict == VelocityVerdict(
        allowed=True, rate=12.5, limit=100.0, baseline=10.0, multiple=1.25
    )


def test_an_allowed_verdict_without_limit_or_baseline_reads_them_as_none() -> None:
    verdict = CODECS[Record].result(RECORD, packed(1, 7, NAN, NAN, NAN))
    assert verdict == VelocityVerdict(allowed=True, rate=7.0)


def test_a_gate_that_finds_the_key_closed_reads_as_allowed_and_nothing_more() -> None:
    assert CODECS[Gate].result(Gate("k"), packed(1)) == VelocityVerdict(allowed=True)


def test_a_refusal_reads_every_field() -> None:
    verdict = CODECS[Record].result(RECORD, REFUSAL)
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


def test_an_admission_reads_its_bucket_verdict_then_its_velocity_verdict_to_the_end() -> None:
    admit = Admit("k", 1, 1, VelocityPolicy(), BucketPolicy(rate=2.0, capacity=5.0))
    bucket = packed(0, 0.5, 5, 2, 0.25, 0)
    verdict = CODECS[Admit].result(admit, packed(0) + bucket + REFUSAL)
    assert verdict == AdmitVerdict(
        allowed=False,
        velocity=CODECS[Record].result(RECORD, REFUSAL),
        bucket=BucketVerdict(False, 0.5, 5.0, 2.0, 0.25, False),
    )
    no_bucket = packed(-1, 0, 0, 0, 0, 0)
    assert CODECS[Admit].result(admit, packed(1) + no_bucket + packed(1)) == AdmitVerdict(
        allowed=True, velocity=VelocityVerdict(allowed=True), bucket=None
    )
    assert CODECS[Admit].result(admit, packed(1) + bucket + packed(-1)).velocity is None


def test_a_lease_reads_what_it_granted_its_first_trip_and_its_admission() -> None:
    lease = Lease("k", 1, 1, 10, 0, (), VelocityPolicy(), BucketPolicy(rate=2.0, capacity=5.0))
    admission = packed(1, 1, 4, 5, 2, 0, 1) + packed(1, 3, NAN, NAN, NAN)
    no_trip = packed(-1, 0, 0, 0, NAN, NAN, NAN, 0, NAN)
    verdict = CODECS[Lease].result(lease, packed(3) + REFUSAL + admission)
    assert verdict.granted == 3.0 and verdict.tripped == CODECS[Record].result(RECORD, REFUSAL)
    assert verdict.admit.bucket == BucketVerdict(True, 4.0, 5.0, 2.0, 0.0, True)
    assert verdict.admit.velocity == VelocityVerdict(allowed=True, rate=3.0)
    assert CODECS[Lease].result(lease, packed(0) + no_trip + admission).tripped is None
    back = ReturnLease("k", 0, (), VelocityPolicy(), None)
    assert CODECS[ReturnLease].result(back, packed(-1)) is None
    assert CODECS[ReturnLease].result(back, REFUSAL) == CODECS[Record].result(RECORD, REFUSAL)


ADMIT = Admit("k", 1, 1, VelocityPolicy(), None)
LEASE = Lease("k", 1, 1, 10, 0, (), VelocityPolicy(), None)
UNREADABLE = [
    (RECORD, REFUSAL[:-1]),  # a byte short
    (RECORD, REFUSAL + b"\0"),
    (RECORD, b""),
    (RECORD, packed(0)),  # 8 bytes must say allowed (1) or no verdict (-1)
    (RECORD, packed(-1)),  # a record always decides
    (RECORD, "1 0 0 7 nan nan nan 0 nan"),  # text: decoded by a client, or an old reply
    (RECORD, None),
    (Gate("k"), [b"1"]),
    (ADMIT, packed(1, -1, 0, 0, 0, 0)),  # the bucket verdict cut short
    (ADMIT, packed(1, -1, 0, 0, 0, 0, 0) + packed(1)[:4]),
    (LEASE, packed(3) + REFUSAL),  # no admission
    (LEASE, packed(3)),
    (ReturnLease("k", 0, (), None, None), b"-1"),
]


@pytest.mark.parametrize(("op", "reply"), UNREADABLE)
def test_an_unreadable_decision_reply_is_a_store_failure_not_a_crash(op: Any, reply: Any) -> None:
    with pytest.raises(StoreUnavailable, match=f"redis {op.name}: unreadable reply"):
        CODECS[type(op)].result(op, reply)
