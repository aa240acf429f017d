"""MemoryStore.run_many: one call's operations at one moment, under one hold of the lock."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import Clock
from tokenfuse import VelocityPolicy
from tokenfuse._core.loops import LoopPolicy
from tokenfuse._stores.memory import MemoryStore
from tokenfuse._stores.ops import CheckLoops, Gate, NoteLoop, Op, ReadStatus, Record

CEILING = VelocityPolicy(limit=1000, cooldown=30)
LOOPS = LoopPolicy(failures=2)
CALL = "0123456789abcdef"


class CountingClock(Clock):
    """The test clock, counting how often it is read."""

    def __init__(self) -> None:
        super().__init__()
        self.readings = 0

    def __call__(self) -> float:
        self.readings += 1
        return super().__call__()


def a_calls_steps() -> list[Op[Any]]:
    """What one guarded call sends: its gate with its loop check, then its record with its
    note; twice over, so that the second half sees what the first did (a trip, a failure)."""
    steps: list[Op[Any]] = []
    for amount in (600.0, 700.0):
        steps += [Gate("k"), CheckLoops("k", CALL, LOOPS)]
        steps += [Record("k", amount, CEILING), NoteLoop("k", CALL, LOOPS, True, 500, "e")]
    return [*steps, ReadStatus("k", CEILING, None)]


def test_a_batch_answers_as_its_operations_run_one_by_one(clock: Clock) -> None:
    batched, alone = MemoryStore(clock=clock), MemoryStore(clock=clock)
    results = batched.run_many(a_calls_steps())
    assert results == [alone.run(op) for op in a_calls_steps()]
    tripped = results[6]  # the second record: over the ceiling
    assert (tripped.allowed, tripped.tripped) == (False, True)
    assert results[7].tripped  # the second failure of the call trips it


def test_a_batch_reads_the_injected_clock_once() -> None:
    clock = CountingClock()
    store = MemoryStore(clock=clock)
    store.run_many(a_calls_steps())
    assert clock.readings == 1
    clock.advance(31)  # past the ceiling's cooldown, on the injected clock
    assert store.run_many([Gate("k")])[0].allowed


def test_an_operation_that_raises_leaves_those_before_it_done(clock: Clock) -> None:
    store = MemoryStore(clock=clock)
    with pytest.raises(KeyError):
        store.run_many([Record("k", 100.0, CEILING), object()])  # type: ignore[list-item]
    status = store.run(ReadStatus("k", CEILING, None))  # the lock was let go
    assert status.rate == 100.0


def test_a_subclass_that_overrides_run_is_handed_each_operation_of_a_batch(clock: Clock) -> None:
    seen: list[str] = []

    class Counting(MemoryStore):
        def run(self, op: Op[Any]) -> Any:
            seen.append(op.name)
            return super().run(op)

    results = Counting(clock=clock).run_many(a_calls_steps())
    assert seen == [op.name for op in a_calls_steps()]
    assert results == MemoryStore(clock=clock).run_many(a_calls_steps())
