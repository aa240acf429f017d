"""Plans: logic of several I/O steps written once, run by a sync or an asyncio driver.

A plan is a generator that yields each step it needs done (an operation for a store, a
command for a client) and receives its result; what it returns is the plan's result. The
logic lives in the plan, and only the drivers differ: ``drive`` calls each step, ``adrive``
also awaits it. So a listing that pages through a store, or a SCAN followed by a batched GET,
has no hand-kept sync and async copies.

>>> def twice(x):
...     first = yield x
...     second = yield first
...     return first + second
>>> drive(twice(3), lambda step: step * 10)
330
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar

__all__ = ["Plan", "adrive", "drive"]

S = TypeVar("S")
R = TypeVar("R")

#: A plan of steps ``S`` that returns an ``R``.
Plan = Generator[S, Any, R]


def drive(plan: Plan[S, R], execute: Callable[[S], Any]) -> R:
    """Run ``plan``, doing each step with ``execute``."""
    reply: Any = None
    while True:
        try:
            step = plan.send(reply)
        except StopIteration as done:
            result: R = done.value
            return result
        reply = execute(step)


async def adrive(plan: Plan[S, R], execute: Callable[[S], Awaitable[Any] | Any]) -> R:
    """Run ``plan``, doing each step with ``execute`` and awaiting what it returns (a step
    that needs no I/O may return its result directly)."""
    reply: Any = None
    while True:
        try:
            step = plan.send(reply)
        except StopIteration as done:
            result: R = done.value
            return result
        reply = execute(step)
        if inspect.isawaitable(reply):
            reply = await reply
