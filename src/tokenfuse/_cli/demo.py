"""``tokenfuse demo``: a runaway agent loop stopped on the embedded store, then reset by hand.

Needs nothing but tokenfuse itself: no Redis, no network, no HTTP library. The agent's model
calls are simulated (each one's tokens grow with the context it re-sends), and so is the clock:
three days of normal work take a fraction of a second. Only the loop is paced (``pace`` real
seconds per call) so that a person can watch it; tests pass 0.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TextIO

from .._admin.service import Admin
from .._core.velocity import VelocityPolicy
from .._errors import LoopSuspected
from .._events import logger
from .._fuse import Fuse
from .._identity import Identity
from .._stores.memory import MemoryStore

__all__ = ["run_demo"]

API_KEY = "sk-proj-demo-agent-7f3a"
TASK_TOKENS = 1_200  # one normal model call
GROWTH = 400  # tokens a looping call adds to the context each time


class _Clock:
    def __init__(self) -> None:
        self.now = 1_767_225_600.0  # 2026-01-01T00:00:00Z

    def __call__(self) -> float:
        return self.now


def run_demo(
    out: TextIO, *, pace: float = 0.15, sleep: Callable[[float], None] = time.sleep
) -> int:
    """Tell the story on ``out``; 0 when the loop was stopped and the reset let the key in."""

    def say(line: str = "") -> None:
        out.write(line + "\n")
        out.flush()

    # tokenfuse logs every event on the "tokenfuse" logger: show those lines in order, marked.
    log = logging.StreamHandler(out)
    log.setFormatter(logging.Formatter("  [tokenfuse log, %(levelname)s] %(message)s"))
    logger.addHandler(log)
    try:
        return _story(say, pace, sleep)
    finally:
        logger.removeHandler(log)


def _story(say: Callable[..., None], pace: float, sleep: Callable[[float], None]) -> int:
    clock = _Clock()
    fuse = Fuse(MemoryStore(clock=clock), velocity=VelocityPolicy())
    admin = Admin(fuse)
    agent = Identity.secret(API_KEY)

    say("tokenfuse demo: one agent, the embedded store (no Redis), a simulated clock")
    say(f"the agent's API key is counted as {agent.label}, key id {fuse.key_id(agent)}")
    say()
    say("3 simulated days of normal work: a task every 30 minutes, 2 model calls each ...")
    for _ in range(3 * 48):
        for _ in range(2):
            fuse.gate(agent).raise_if_refused()
            fuse.record(agent, TASK_TOKENS)
        clock.now += 30 * 60
    status = fuse.status(agent)
    say(
        f"  learned baseline: {status.baseline or 0:,.0f} tokens/min over {status.samples} "
        f"active minutes; a loop trips at {10 * (status.baseline or 0):,.0f} tokens/min"
    )
    say()
    say("a bug: the agent retries a failing tool every 3 s, re-sending its growing context")
    start, context, step = clock.now, TASK_TOKENS, 0
    try:
        for step in range(1, 200):  # bounded: the fuse stops it long before
            fuse.gate(agent).raise_if_refused()
            decision = fuse.record(agent, context)
            note = (
                "  <- these tokens trip the fuse (the log line above)" if decision.tripped else ""
            )
            say(f"  call {step:3d} at t+{clock.now - start:3.0f} s: {context:6,.0f} tokens{note}")
            context += GROWTH
            clock.now += 3
            sleep(pace)
    except LoopSuspected as refusal:
        say(f"  call {step:3d} at t+{clock.now - start:3.0f} s: refused before it was sent")
        say()
        say(f"LoopSuspected: {refusal}")
    else:
        say("the loop was never stopped")
        return 1
    say()
    say("an operator sees it (tokenfuse blocked), and resets it by its key id:")
    for view in admin.blocked():
        say(
            f"  {view.label} {view.key_id}  {view.state}  {view.status.rate:,.0f} tokens/min, "
            f"{view.multiple or 0:.1f}x its baseline"
        )
    say(f"  $ tokenfuse reset {fuse.key_id(agent)}")
    (after,) = admin.reset(fuse.key_id(agent))
    allowed = fuse.gate(agent).allowed
    say(f"  state now: {after.state}; the next call is {'allowed' if allowed else 'refused'}")
    return 0 if allowed else 1
