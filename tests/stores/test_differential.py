"""The Lua scripts are the policy core: same verdicts, same state, bit for bit.

Hypothesis draws policies and sequences of operations over one to three keys, with clock
jumps from a millisecond to days, and runs each sequence through ``MemoryStore`` (the pure
core applied in Python) and through ``RedisStore`` (the core as Lua) on the same simulated
clock. After every operation the verdicts must be equal and the state read back from Redis
must equal the core's state object field by field, floats compared with ``==``: Lua and
CPython do the same IEEE double operations in the same order and call the same libm, so no
tolerance is needed (none is used). Each refusal may be retried exactly at its
``retry_after``, where a millionth of a token or of a second decides.

One caveat, for the core: ``velocity._window`` adds the ring with ``sum()``, which adds left
to right on CPython < 3.12 (as the Lua does) but with compensation since 3.12.

Amounts are floats from 1e-9 up and integers up to 2**53: beyond that ``MemoryStore`` keeps
the Python int itself where Redis keeps its nearest double (verdicts still agree).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import fakeredis
import pytest
import redis
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from tests.conftest import Clock
from tests.stores.conftest import delete_prefix, read_states, unique_prefix
from tokenfuse import BucketPolicy, MemoryStore, VelocityPolicy
from tokenfuse._core.lease import LeaseVerdict
from tokenfuse._core.velocity import VelocityVerdict
from tokenfuse._stores import open_keys
from tokenfuse._stores.ops import (
    UNSET,
    Admit,
    Configure,
    Forgive,
    Gate,
    Lease,
    Op,
    ReadStatus,
    Record,
    RecordBatch,
    Reset,
    ReturnLease,
)
from tokenfuse._stores.redis import RedisStore

KEYS = ("alpha", "beta", "gamma")

finite = {"allow_nan": False, "allow_infinity": False}
rates = st.floats(50, 20_000, **finite)
velocity_policies = st.builds(
    VelocityPolicy,
    limit=st.none() | rates,
    spike_multiple=st.floats(1.5, 20, **finite),
    min_baseline=st.floats(0, 300, **finite),
    learning_period=st.sampled_from([0.0, 30.0]) | st.floats(0, 900, **finite),
    min_samples=st.integers(0, 5),
    cold_start_limit=st.none() | rates | st.floats(20_000, 1e7, **finite),
    cold_start_sustained=st.none() | rates | st.floats(20_000, 1e7, **finite),
    sustained_multiple=st.floats(0.5, 10, **finite),
    sustained_baseline_multiple=st.floats(0.5, 8, **finite),
    early_threshold=st.none() | st.floats(0.5, 15, **finite),
    ceiling_multiple=st.none() | st.floats(1, 200, **finite),
    learn_clip=st.floats(1, 10, **finite),
    rms_share=st.none() | st.floats(0.1, 2, **finite),
    cold_start_samples=st.integers(0, 5),
    half_life=st.floats(30, 3 * 86_400, **finite),
    cooldown=st.floats(0.5, 120, **finite),
    cooldown_max=st.floats(1, 3_600, **finite),
    escalation_window=st.floats(0, 3_600, **finite),
)
bucket_policies = st.builds(
    BucketPolicy,
    rate=st.sampled_from([0.01, 0.02, 0.5]) | st.floats(0.01, 50, **finite),
    capacity=st.sampled_from([2.5, 3.0]) | st.floats(2.5, 100, **finite),  # every cost fits
    near_limit_fraction=st.floats(0.05, 1, **finite),
    near_limit_after=st.sampled_from([0.0, 60.0]) | st.floats(0, 600, **finite),
)
amounts = (
    st.floats(1e-9, 1e-3, **finite)
    | st.floats(0.5, 5_000, **finite)
    | st.sampled_from([100.0, 250.0, 1_000.0, 4_000.0])  # repeats: baselines, then spikes
    | st.integers(1, 2**53)
    | st.integers(1, 2_000)
)
steps = (
    st.just(0.0)
    | st.floats(0.001, 1, **finite)
    | st.floats(1, 30, **finite)
    | st.sampled_from([5.0, 60.0, 2.5])
    | st.floats(30, 900, **finite)
    | st.floats(900, 3 * 86_400, **finite)
)
overrides = st.just(UNSET) | st.none() | st.floats(0.5, 5_000, **finite)


@st.composite
def operations(draw: st.DrawFn, keys: int) -> tuple[Any, ...]:
    key = KEYS[draw(st.integers(0, keys - 1))]
    kind = draw(
        st.sampled_from(
            ["record"] * 6
            + ["gate"] * 2
            + ["admit"] * 4
            + ["lease"] * 3
            + ["reset", "configure", "batch", "forgive", "return"]
        )
    )
    if kind == "record":
        return kind, key, draw(amounts)
    if kind == "batch":
        return kind, key, tuple(draw(st.lists(amounts, min_size=1, max_size=5)))
    if kind == "admit":
        cost = draw(st.sampled_from([0.0, 1.0, 1.0, 2.5]))
        amount = draw(st.just(0.0) | amounts)
        return kind, key, cost, amount, draw(st.booleans()), draw(st.booleans())
    if kind == "configure":
        return kind, key, draw(overrides), draw(overrides), draw(overrides)
    if kind in ("lease", "return"):
        cost = draw(st.sampled_from([0.0, 1.0, 1.0, 2.5]))
        amount = draw(st.just(0.0) | amounts)
        want = draw(st.sampled_from([0.0, 1.0, 7.5]) | st.floats(0, 200, **finite))
        give_back = draw(st.sampled_from([0.0, 3.0]) | st.floats(0, 200, **finite))
        pending = tuple(draw(st.lists(amounts, max_size=4)))
        policies = draw(st.booleans()), draw(st.booleans())
        return kind, key, cost, amount, want, give_back, pending, *policies
    return kind, key


@dataclass
class Scenario:
    start: float
    velocity: VelocityPolicy
    bucket: BucketPolicy
    keys: int
    ops: list[tuple[float, tuple[Any, ...], bool]]  # (step, operation, retry if refused)


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    keys = draw(st.integers(1, 3))
    ops = draw(st.lists(st.tuples(steps, operations(keys), st.booleans()), min_size=8, max_size=40))
    return Scenario(
        start=1_767_225_600.0 + draw(st.floats(0, 86_400, **finite)),
        velocity=draw(velocity_policies),
        bucket=draw(bucket_policies),
        keys=keys,
        ops=ops,
    )


# A key that learns quickly, so that short sequences reach every rule of an established key.
learning_policies = st.builds(
    VelocityPolicy,
    limit=st.none(),
    spike_multiple=st.floats(2, 12, **finite),
    min_baseline=st.floats(0, 50, **finite),
    learning_period=st.just(0.0),
    min_samples=st.integers(1, 5),
    cold_start_limit=st.none() | st.floats(1_000, 50_000, **finite),
    cold_start_sustained=st.none() | st.floats(500, 20_000, **finite),
    sustained_multiple=st.floats(1, 8, **finite),
    sustained_baseline_multiple=st.floats(1, 6, **finite),
    early_threshold=st.floats(1, 10, **finite),
    ceiling_multiple=st.none() | st.floats(2, 60, **finite),
    learn_clip=st.floats(1, 6, **finite),
    rms_share=st.none() | st.floats(0.5, 1.5, **finite),
    cold_start_samples=st.integers(0, 5),
    half_life=st.floats(600, 86_400, **finite),
    cooldown=st.floats(5, 120, **finite),
)
RuleOp = tuple[float, tuple[Any, ...], bool]


@st.composite
def misbehaviour(draw: st.DrawFn, base: float, call: float) -> list[RuleOp]:
    """What each rule watches for, with drawn sizes and paces (``base`` per minute in calls
    of ``call``): a burst of calls (early check, spike), large calls repeating (sparse, own
    ceiling), a sustained rise (sustained)."""
    pattern = draw(st.sampled_from(["burst", "large", "sustained"]))
    record = ("record", "alpha")
    if pattern == "burst":
        gap = draw(st.floats(0.05, 3, **finite))
        size = call * draw(st.floats(0.3, 3, **finite))
        return [(gap, (*record, size), False)] * draw(st.integers(5, 60))
    if pattern == "large":
        size = base * draw(st.floats(5, 500, **finite))
        gap = draw(st.floats(30, 200, **finite))
        return [(gap, (*record, size), draw(st.booleans())) for _ in range(draw(st.integers(2, 6)))]
    multiple = draw(st.floats(1.5, 10, **finite))
    gap = draw(st.floats(5, 40, **finite))
    return [(gap, (*record, base * multiple * gap / 60), False)] * draw(st.integers(10, 90))


@st.composite
def rule_scenarios(draw: st.DrawFn) -> Scenario:
    """A key that learns a baseline (or, for a new key, none), then misbehaves."""
    base = draw(st.sampled_from([100.0, 250.0, 1_000.0]))
    every = draw(st.floats(10, 60, **finite))
    minutes = draw(st.sampled_from([0, 20, 40]))
    ops: list[RuleOp] = [
        (every, ("record", "alpha", base * every / 60 * draw(st.floats(0.5, 1.5))), False)
        for _ in range(int(minutes * 60 / every))
    ]
    misbehaving = draw(misbehaviour(base, base * every / 60))
    ops += misbehaving
    if draw(st.booleans()):  # forgiven: the same again, an hour or a day later
        ops.append((draw(st.floats(0, 120, **finite)), ("forgive", "alpha"), False))
        ops.append((draw(st.sampled_from([3_600.0, 86_400.0])), ("gate", "alpha"), False))
        ops += misbehaving
    ops += draw(st.lists(st.tuples(steps, operations(1), st.booleans()), max_size=8))
    return Scenario(
        start=1_767_225_600.0 + draw(st.floats(0, 86_400, **finite)),
        velocity=draw(learning_policies),
        bucket=draw(bucket_policies),
        keys=1,
        ops=ops,
    )


def operation(drawn: tuple[Any, ...], scenario: Scenario) -> Op[Any]:
    """The store operation a drawn step stands for."""
    kind, key, *args = drawn
    if kind == "record":
        return Record(key, args[0], scenario.velocity)
    if kind == "batch":
        return RecordBatch(key, args[0], scenario.velocity)
    if kind == "gate":
        return Gate(key)
    if kind == "admit":
        cost, amount, with_velocity, with_bucket = args
        velocity = scenario.velocity if with_velocity else None
        bucket = scenario.bucket if with_bucket else None
        return Admit(key, cost=cost, amount=amount, velocity=velocity, bucket=bucket)
    if kind in ("lease", "return"):
        cost, amount, want, give_back, pending, with_velocity, with_bucket = args
        velocity = scenario.velocity if with_velocity else None
        bucket = scenario.bucket if with_bucket else None
        if kind == "return":
            return ReturnLease(key, give_back, pending, velocity, bucket)
        return Lease(key, cost, amount, want, give_back, pending, velocity, bucket)
    if kind == "forgive":
        return Forgive(key)
    if kind == "reset":
        return Reset(key)
    limit, capacity, rate = args
    return Configure(key, limit=limit, capacity=capacity, rate=rate)


def label(verdict: Any) -> float:
    """Note what the sequences reach (``pytest --hypothesis-show-statistics``); return the
    verdict's ``retry_after``, if it is a refusal."""
    if isinstance(verdict, LeaseVerdict):
        if verdict.granted > 0:
            event("lease granted")
        if verdict.tripped is not None:
            event("tripped by a lease's calls")
        verdict = verdict.admit
    velocity = getattr(verdict, "velocity", verdict)
    bucket = getattr(verdict, "bucket", None)
    retry_after = 0.0
    if isinstance(velocity, VelocityVerdict):
        retry_after = velocity.retry_after
        if velocity.tripped:
            event(f"tripped: {velocity.reason}")
    if bucket is not None:
        event("bucket refused" if not bucket.allowed else "bucket admitted")
        retry_after = max(retry_after, bucket.retry_after)
        if bucket.near_limit:
            event("near-limit alert")
    return retry_after


def check(scenario: Scenario, client: redis.Redis) -> None:
    # The store's open-key view stays in the loop, trusted all along: on a busy machine its
    # thread can go quiet for longer than STALE_AFTER, and the sync that follows reads the
    # markers, whose PX (the latch's time left on the simulated clock) runs out on the real
    # one: a latch still open in simulated time would vanish from the view.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(open_keys, "STALE_AFTER", 600.0)
        check_in_step(scenario, client)


def check_in_step(scenario: Scenario, client: redis.Redis) -> None:
    clock = Clock(scenario.start)
    prefix = unique_prefix()
    memory = MemoryStore(clock=clock, ttl=float("inf"))  # Redis TTLs run on the real clock
    lua = RedisStore(client, prefix=prefix, clock=clock)
    keys = KEYS[: scenario.keys]
    try:
        for step, (dt, drawn, retry) in enumerate(scenario.ops):
            clock.advance(dt)
            op = operation(drawn, scenario)
            expected = memory.run(op)
            assert lua.run(op) == expected, f"verdict of step {step}: {op}"
            retry_after = label(expected)
            if retry and retry_after > 0:
                # Exactly when told: the boundary of the latch and of the bucket's refill.
                clock.advance(retry_after)
                expected = memory.run(op)
                assert lua.run(op) == expected, f"retry of step {step}: {op}"
                label(expected)
            entries = [memory._entries.get(key) for key in keys]
            states = [(e.velocity, e.bucket) if e else (None, None) for e in entries]
            assert read_states(client, prefix, keys) == states, f"state after step {step}: {op}"
            if any(v is not None and any(v.profile) for v, _ in states):
                event("hourly allowance taught by forgive")
            share = scenario.velocity.rms_share
            if share and any(
                v is not None and share * v.spread**0.5 > v.baseline > 0 for v, _ in states
            ):
                event("normal set by the mean square (a bursty key)")
        for key in keys:
            read = ReadStatus(key, scenario.velocity, scenario.bucket)
            status = memory.run(read)
            assert lua.run(read) == status
            if status.samples:
                event("learned minutes" if not status.established else "established")
        assert lua.scripts == "functions"  # FCALL of the library, not the EVALSHA fallback
    finally:
        delete_prefix(client, prefix)


def differential(examples: int) -> Callable[[Callable[..., None]], Any]:
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def boundaries(velocity: VelocityPolicy, bucket: BucketPolicy) -> Scenario:
    """Drain a bucket and trip a key, retrying each refusal exactly at its retry_after: where
    1e-6 of a token or of a second decides (random draws reach these cases only rarely)."""
    ops: list[tuple[float, tuple[Any, ...], bool]] = [
        (0.013, ("admit", "alpha", 1.0, 0.0, False, True), True) for _ in range(6)
    ]
    ops += [(0.7, ("admit", "alpha", 1.0, 40.0, True, False), True) for _ in range(4)]
    ops += [(0.0, ("gate", "alpha"), True), (0.0, ("admit", "alpha", 2.5, 0.0, True, True), True)]
    return Scenario(1_767_225_600.0 + 1234.567, velocity, bucket, 1, ops)


BOUNDARIES = [
    boundaries(VelocityPolicy(limit=100, cooldown=7.3), BucketPolicy(rate=rate, capacity=3))
    for rate in (0.3, 7.0, 0.01)
]


@pytest.mark.redis
@differential(300)
@given(scenario=scenarios() | rule_scenarios())
@example(scenario=BOUNDARIES[0])
@example(scenario=BOUNDARIES[1])
@example(scenario=BOUNDARIES[2])
def test_lua_on_redis_is_the_core(scenario: Scenario, redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        check(scenario, client)
    finally:
        client.close()


@differential(40)
@given(scenario=scenarios() | rule_scenarios())
@example(scenario=BOUNDARIES[0])
def test_lua_on_fakeredis_is_the_core(scenario: Scenario) -> None:
    """fakeredis has no ``struct`` library: this also checks the Lua fallback packing."""
    check(scenario, fakeredis.FakeRedis())
