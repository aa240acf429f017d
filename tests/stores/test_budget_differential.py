"""The run-budget scripts are the budget core: same verdicts, same state, bit for bit.

Hypothesis draws sequences of run operations (open, join, reserve, settle, release, read)
over two runs, with clock jumps across the runs' TTL, and runs each through ``MemoryStore``
(``_core/budget.py`` in Python) and ``RedisStore`` (``lua/_budget.lua``) on the same simulated
clock: after every operation the verdicts, and the state each store holds, must be equal, the
floats compared with ``==``. On a real Redis and on fakeredis (plain-Lua packing).
"""

from __future__ import annotations

from typing import Any

import fakeredis
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import Clock
from tests.stores.conftest import delete_prefix, unique_prefix
from tokenfuse import MemoryStore
from tokenfuse._stores.ops import Op, OpenRun, ReadRun, Reserve, Settle
from tokenfuse._stores.redis import RedisStore

RUNS = ("run:alpha", "run:beta")
finite = {"allow_nan": False, "allow_infinity": False}
limits = st.just(-1.0) | st.floats(0, 10_000, **finite) | st.sampled_from([100.0, 1_000.0])
tokens = (
    st.just(0.0)
    | st.floats(0, 3_000, **finite)
    | st.integers(1, 2_000).map(float)
    | st.sampled_from([80.0, 800.0, 1.0])  # lands on 80 % of a sampled limit: the near rule
)
dollars = st.just(0.0) | st.floats(0, 5, **finite) | st.sampled_from([0.1, 0.25, 0.3])
ttls = st.sampled_from([60.0, 3_600.0]) | st.floats(1, 86_400, **finite)
steps = st.just(0.0) | st.floats(0.001, 30, **finite) | st.floats(30, 7_200, **finite)


@st.composite
def run_ops(draw: st.DrawFn) -> Op[Any]:
    key = draw(st.sampled_from(RUNS))
    ttl = draw(ttls)
    kind = draw(st.sampled_from(["open", "join", "reserve", "reserve", "settle", "read"]))
    if kind in ("open", "join"):
        return OpenRun(key, draw(limits), draw(limits) / 1000, ttl, join=kind == "join")
    if kind == "reserve":
        return Reserve(key, draw(tokens), draw(dollars), ttl)
    if kind == "settle":
        held = (draw(tokens), draw(dollars))
        spent = draw(st.just((0.0, 0.0)) | st.tuples(tokens, dollars))
        return Settle(key, *held, *spent, ttl)
    return ReadRun(key)


def _redis_store(kind: str, request: pytest.FixtureRequest, clock: Clock) -> Any:
    prefix = unique_prefix()
    if kind == "fakeredis":
        return RedisStore(fakeredis.FakeRedis(), prefix=prefix, clock=clock), None
    client = redis.Redis.from_url(request.getfixturevalue("redis_url"))
    return RedisStore(client, prefix=prefix, clock=clock), (client, prefix)


@pytest.mark.parametrize(
    "kind", [pytest.param("redis", marks=pytest.mark.redis), pytest.param("fakeredis")]
)
def test_lua_and_python_agree_on_runs(kind: str, request: pytest.FixtureRequest) -> None:
    clock = Clock()
    redis_store, owned = _redis_store(kind, request, clock)

    @settings(
        max_examples=60 if kind == "redis" else 30,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(st.lists(st.tuples(steps, run_ops()), min_size=5, max_size=40))
    def check(sequence: list[tuple[float, Op[Any]]]) -> None:
        clock.advance(100_000.0)  # every run of the previous example has expired
        memory = MemoryStore(clock=clock)
        for step, op in sequence:
            clock.advance(step)
            expected = memory.run(op)
            found = redis_store.run(op)
            assert found == expected, op
            for key in RUNS:
                assert redis_store.run(ReadRun(key)) == memory.run(ReadRun(key))

    try:
        check()
        assert redis_store.scripts == "functions"  # FCALL, not the EVALSHA fallback
    finally:
        if owned is not None:
            client, prefix = owned
            delete_prefix(client, prefix)
            client.close()
