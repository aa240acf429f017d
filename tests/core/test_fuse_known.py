"""Fuse.admit_with / gate_with when the store answers the extra operation itself
(``RedisStore.known``: its open-key view answers a local loop check): the admission goes
alone, as a plain call, and the answer is the pipeline's result; a failed admission drops it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.conftest import Clock
from tokenfuse import Fuse, StoreUnavailable
from tokenfuse._core.loops import LoopPolicy, LoopVerdict
from tokenfuse._stores.memory import MemoryStore
from tokenfuse._stores.ops import CheckLoops, Op

CHECK = CheckLoops("inbound:k", "0123456789abcdef", LoopPolicy(), local=True)
ANSWER = LoopVerdict(failures=2.0)


class Logged(MemoryStore):
    """A MemoryStore that logs each call (a pipeline's operations joined by "+"), answers
    ``known`` with ``answer`` (None: it answers nothing), and fails while ``down``."""

    def __init__(self, clock: Clock, answer: Any = ANSWER) -> None:
        super().__init__(clock=clock)
        self.answer = answer
        self.down = False
        self.log: list[str] = []
        self.asked: list[Op[Any]] = []

    def known(self, op: Op[Any]) -> Any:
        self.asked.append(op)
        return self.answer

    def run(self, op: Op[Any]) -> Any:
        self.log.append(op.name)
        if self.down:
            raise StoreUnavailable("down")
        return super().run(op)

    def run_many(self, ops: Any) -> list[Any]:
        self.log.append("+".join(op.name for op in ops))
        if self.down:
            raise StoreUnavailable("down")
        return [MemoryStore.run(self, op) for op in ops]

    async def arun(self, op: Op[Any]) -> Any:
        return self.run(op)

    async def arun_many(self, ops: Any) -> list[Any]:
        return self.run_many(ops)


def admit_with(fuse: Fuse, ops: list[Op[Any]], asyncio_: bool) -> tuple[Any, Any]:
    if asyncio_:
        return asyncio.run(fuse.aadmit_with("agent", ops))
    return fuse.admit_with("agent", ops)


@pytest.mark.parametrize("asyncio_", [False, True], ids=["sync", "asyncio"])
def test_an_answered_check_sends_the_admission_alone(clock: Clock, asyncio_: bool) -> None:
    store = Logged(clock)
    decision, found = admit_with(Fuse(store), [CHECK], asyncio_)
    assert decision.allowed and not decision.degraded
    assert found == [ANSWER]
    assert store.log == ["admit"]  # a plain call, no pipeline
    assert store.asked == [CHECK]


@pytest.mark.parametrize("asyncio_", [False, True], ids=["sync", "asyncio"])
def test_an_unanswered_check_goes_in_the_pipeline(clock: Clock, asyncio_: bool) -> None:
    store = Logged(clock, answer=None)
    decision, found = admit_with(Fuse(store), [CHECK], asyncio_)
    assert decision.allowed
    assert store.log == ["admit+check_loops"]
    assert found is not None and len(found) == 1 and found[0] is not ANSWER


@pytest.mark.parametrize("asyncio_", [False, True], ids=["sync", "asyncio"])
def test_two_ops_go_in_the_pipeline_unasked(clock: Clock, asyncio_: bool) -> None:
    """Only a lone operation is asked first: of several, the store's pipeline asks each
    once (a miss asked twice would be counted twice by the view)."""
    store = Logged(clock)
    admit_with(Fuse(store), [CHECK, CHECK], asyncio_)
    assert store.log == ["admit+check_loops+check_loops"]
    assert store.asked == []


@pytest.mark.parametrize("asyncio_", [False, True], ids=["sync", "asyncio"])
def test_a_failed_admission_drops_the_answer(clock: Clock, asyncio_: bool) -> None:
    """As a failed pipeline: the admission fails open, and the check goes unchecked (None),
    whatever the store answered for it."""
    store = Logged(clock)
    store.down = True
    decision, found = admit_with(Fuse(store), [CHECK], asyncio_)
    assert decision.allowed and decision.degraded
    assert found is None


def test_a_store_without_known_sends_the_pipeline(clock: Clock) -> None:
    store = MemoryStore(clock=clock)
    assert not hasattr(store, "known")
    decision, found = Fuse(store).admit_with("agent", [CHECK])
    assert decision.allowed and found is not None and isinstance(found[0], LoopVerdict)
