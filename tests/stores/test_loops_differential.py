"""The failure-loop breaker's Lua is its core (``_core/loops.py``): same verdicts, same state.

As ``test_differential`` does for the velocity core: Hypothesis draws a loop policy and a
sequence of checks (counting a send, or only asking "is it tripped?"), notes (failed, not,
or not counted; with a status and an error type; counting the send or not), batches of notes
and forgets over a few calls of one or two identities, with clock steps from nothing to past
every window, and runs it through ``MemoryStore`` and through ``RedisStore`` (a real Redis,
and fakeredis, whose Lua has no ``struct`` library) on the same simulated clock. After every
step the verdicts must be equal, and so must the calls read back from Redis and the core's,
float for float. Small
policies (two calls remembered, two failures) reach eviction, trips, cooldowns and repeat
refusals within a few steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import fakeredis
import pytest
import redis
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.conftest import Clock
from tests.stores.conftest import delete_prefix, unique_prefix
from tokenfuse import MemoryStore
from tokenfuse._core.loops import LoopPolicy, LoopState
from tokenfuse._stores.ops import CheckLoops, ForgetLoops, NoteLoop, NoteLoopBatch, Op
from tokenfuse._stores.redis import RedisStore
from tokenfuse._stores.redis_codec import loop_state, loops_key_of

KEYS = ("default:alpha", "default:beta")
PRINTS = ("0123456789abcdef", "fedcba9876543210", "00000000deadbeef", "aaaaaaaaaaaaaaaa")
finite = {"allow_nan": False, "allow_infinity": False}


@st.composite
def policies(draw: st.DrawFn) -> LoopPolicy:
    cooldown = draw(st.sampled_from([120.0, 0.25]) | st.floats(0.1, 600, **finite))
    multiple = draw(st.sampled_from([1.0, 8.0, 1e6]) | st.floats(1, 50))
    return LoopPolicy(
        failures=draw(st.integers(2, 5)),
        failure_window=draw(st.sampled_from([120.0, 1.0]) | st.floats(0.5, 600, **finite)),
        cooldown=cooldown,
        cooldown_max=min(cooldown * multiple, 86_400),
        repeats=draw(st.integers(2, 6)),
        repeat_window=draw(st.sampled_from([60.0, 2.0]) | st.floats(0.5, 600, **finite)),
        refuse_repeats=draw(st.booleans()),
        max_calls=draw(st.integers(1, 4)),
    )


steps = (
    st.just(0.0)
    | st.floats(0.001, 2, **finite)
    | st.floats(2, 200, **finite)
    | st.sampled_from([60.0, 120.0, 0.25])
    | st.floats(200, 3_000, **finite)
)
errors = st.sampled_from(["", "invalid_request_error", "tool error: bad args!", "x" * 80])
#: A note's outcome: failed, succeeded, or not counted (an SDK's retry).
outcomes = st.booleans() | st.just(True) | st.none()
notes = st.tuples(
    st.just("note"),
    st.sampled_from(KEYS),
    st.sampled_from(PRINTS),
    outcomes,
    st.sampled_from([0, 400, 422, 500, 503]),
    errors,
    st.booleans(),  # counts the send (its check counted none)
)
operations = st.one_of(
    st.tuples(st.just("check"), st.sampled_from(KEYS), st.sampled_from(PRINTS), st.booleans()),
    notes,
    st.tuples(st.just("batch"), st.sampled_from(KEYS), st.lists(notes, min_size=1, max_size=4)),
    st.tuples(st.just("forget"), st.sampled_from(KEYS), st.sampled_from(("", *PRINTS))),
)


@dataclass
class Scenario:
    start: float
    policy: LoopPolicy
    ops: list[tuple[float, tuple[Any, ...]]]


@st.composite
def stuck(draw: st.DrawFn) -> list[tuple[float, tuple[Any, ...]]]:
    """An agent repeating one call (check, then note), mostly failing, at a drawn pace: the
    send counted by the check (``on_repeat="refuse"``) or by the note (``"event"``: the
    check only asks "is it tripped?")."""
    key, mark = draw(st.sampled_from(KEYS)), draw(st.sampled_from(PRINTS[:2]))
    gap = draw(st.floats(0, 30, **finite) | st.sampled_from([121.0, 300.0, 1_000.0]))
    noted = draw(st.booleans())  # the note counts the send
    ops: list[tuple[float, tuple[Any, ...]]] = []
    for _ in range(draw(st.integers(2, 12))):
        failed = draw(st.sampled_from([True, True, True, False]))
        ops.append((gap, ("check", key, mark, not noted)))
        ops.append((0.0, ("note", key, mark, failed, 400, "invalid_request_error", noted)))
    return ops


@st.composite
def stuck_in_batches(draw: st.DrawFn) -> list[tuple[float, tuple[Any, ...]]]:
    """The same agent with its notes sent in batches (``record="background"``): a few checks
    that count nothing, then their notes together, each counting its send."""
    key, mark = draw(st.sampled_from(KEYS)), draw(st.sampled_from(PRINTS[:2]))
    gap = draw(st.floats(0, 30, **finite) | st.sampled_from([121.0, 300.0]))
    ops: list[tuple[float, tuple[Any, ...]]] = []
    for _ in range(draw(st.integers(1, 5))):
        size = draw(st.integers(1, 6))
        ops += [(gap, ("check", key, mark, False)) for _ in range(size)]
        failed = draw(st.lists(st.sampled_from([True, True, False, None]), min_size=size,
                               max_size=size))  # fmt: skip
        batch = [("note", key, mark, each, 500, "server_error", True) for each in failed]
        ops.append((0.0, ("batch", key, batch)))
    return ops


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    ops: list[tuple[float, tuple[Any, ...]]] = []
    for _ in range(draw(st.integers(1, 4))):
        shape = draw(st.sampled_from(["stuck", "stuck in batches", "any"]))
        if shape == "stuck":
            ops += draw(stuck())
        elif shape == "stuck in batches":
            ops += draw(stuck_in_batches())
        else:
            ops += draw(st.lists(st.tuples(steps, operations), min_size=1, max_size=15))
    return Scenario(
        start=draw(st.floats(1_767_225_600.0, 1_767_225_600.0 + 86_400, **finite)),
        policy=draw(policies()),
        ops=ops,
    )


def operation(drawn: tuple[Any, ...], policy: LoopPolicy) -> Op[Any]:
    kind, key, mark, *rest = drawn
    if kind == "check":
        (counts,) = rest
        return CheckLoops(key, mark, policy, local=not counts)
    if kind == "note":
        failed, status, error, send = rest
        return NoteLoop(key, mark, policy, failed, status, error, send)
    if kind == "batch":
        batch = tuple(operation((*note[:1], key, *note[2:]), policy) for note in mark)
        return NoteLoopBatch(key, policy, batch)  # type: ignore[arg-type]
    return ForgetLoops(key, mark)


def memory_state(store: MemoryStore, key: str) -> LoopState:
    return store.loop_state(key) or LoopState()


def run(scenario: Scenario, client: redis.Redis) -> None:
    clock = Clock(scenario.start)
    prefix = unique_prefix()
    memory = MemoryStore(clock=clock, ttl=float("inf"))  # Redis TTLs run on the real clock
    lua = RedisStore(client, prefix=prefix, clock=clock, open_keys=False)
    try:
        for step, (dt, drawn) in enumerate(scenario.ops):
            clock.advance(dt)
            op = operation(drawn, scenario.policy)
            expected = memory.run(op)
            assert lua.run(op) == expected, f"verdict of step {step}: {op}"
            if getattr(expected, "tripped", False):
                event("tripped")
                if expected.retry_after > scenario.policy.cooldown:
                    event("tripped again: a longer cooldown")
            if getattr(expected, "reason", None) is not None and not expected.allowed:
                event(f"refused: {expected.reason}")
            if getattr(expected, "repeated", False):
                event("repeat reported")
            if isinstance(op, CheckLoops) and op.local:
                event("checked without counting")
            if isinstance(op, NoteLoopBatch):
                event("notes in a batch")
                if any(verdict.tripped for verdict in expected):
                    event("tripped in a batch")
            if isinstance(op, NoteLoop) and op.send and expected.repeated:
                event("repeat reported after the call")
            for key in KEYS:
                stored = loop_state(client.get(loops_key_of(prefix, key)))
                assert stored == memory_state(memory, key), f"state after step {step}: {op}"
        assert lua.scripts == "functions"  # FCALL of the library, not the EVALSHA fallback
    finally:
        delete_prefix(client, prefix)
        for key in KEYS:
            client.delete(loops_key_of(prefix, key))


def differential(examples: int) -> Any:
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


@pytest.mark.redis
@differential(200)
@given(scenario=scenarios())
def test_loop_lua_on_redis_is_the_core(scenario: Scenario, redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        run(scenario, client)
    finally:
        client.close()


@differential(30)
@given(scenario=scenarios())
def test_loop_lua_on_fakeredis_is_the_core(scenario: Scenario) -> None:
    """fakeredis has no ``struct`` library: this also checks the Lua fallback packing."""
    run(scenario, fakeredis.FakeRedis())
