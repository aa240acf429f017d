"""Traffic scenarios for the detection benchmark and tests, replayed on a simulated clock.

A scenario is a stream of calls ``(t, amount, phase)`` for one key, ``t`` in seconds from
``START`` and ``phase`` 0 for the key's normal traffic or ``1, 2, ...`` for the calls of a loop
(a scenario may run loops one after another). ``replay`` feeds it through
``Fuse(MemoryStore(clock=...))`` the way the transport does: the gate before each call (a
refused call is not made and spends nothing), then ``record`` of what the call spent.

Everything is generated from a seeded ``random.Random``, so a replay is reproducible. The
"production" traffic is synthetic (no real traces are available here): sessions of agent
turns, each turn a few LLM calls one after another (a call takes seconds), call sizes drawn
from a lognormal law (heavy tail) scaled per session, sessions started by a Poisson process
that follows a diurnal and weekly cycle. It is bursty and heavy-tailed by construction, with
no loop in it; it is not a substitute for a real trace.

Run the table with ``python benchmarks/detection.py``; tests import this module.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from tokenfuse import Fuse, MemoryStore, VelocityPolicy

__all__ = [
    "DAY",
    "HOUR",
    "KEY",
    "MINUTE",
    "START",
    "WARM",
    "Outcome",
    "Scenario",
    "SimClock",
    "daily_pulse",
    "loop",
    "looping",
    "named",
    "normal",
    "poisson",
    "production",
    "ramp",
    "replay",
    "scenarios",
    "steady",
]

MINUTE = 60.0
HOUR = 3_600.0
DAY = 86_400.0
START = 1_767_225_600.0  # 2026-01-01T00:00:00Z, a Thursday; hours of day are UTC
KEY = "agent"

Call = tuple[float, float, int]  # (seconds from START, amount, phase: 0 normal, n: loop n)
Traffic = Iterator[Call]


class SimClock:
    """The store's clock, moved by the replay."""

    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# -- traffic -----------------------------------------------------------------------------------


def _lognormal(rng: random.Random, mean: float, sigma: float) -> float:
    """A lognormal draw with the given mean (not median): heavy-tailed call sizes."""
    return rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)


def poisson(
    rng: random.Random,
    start: float,
    end: float,
    per_minute: float | Callable[[float], float],
    *,
    size: float = 100.0,
    sigma: float = 0.3,
    step: float = 600.0,
) -> Traffic:
    """Independent calls spending ``per_minute`` on average (a number, or a function of the
    time for a rate that changes; it is read every ``step`` seconds), each ``size`` tokens
    on average with lognormal spread ``sigma``."""
    rate = per_minute if callable(per_minute) else (lambda _t, r=per_minute: r)
    t = start
    while t < end:
        segment_end = min(end, (math.floor(t / step) + 1) * step)
        calls_per_second = rate(t) / size / MINUTE
        if calls_per_second <= 0:
            t = segment_end
            continue
        t += rng.expovariate(calls_per_second)
        if t < segment_end:
            yield t, _lognormal(rng, size, sigma) if sigma else size, 0
        else:
            t = segment_end  # memoryless: draw again from the next segment's rate


def loop(start: float, end: float, per_minute: float, size: float, phase: int = 1) -> Traffic:
    """A runaway loop: one call of ``size`` after another, ``per_minute`` on average."""
    every = size * MINUTE / per_minute
    t = start
    while t < end:
        yield t, size, phase
        t += every


def ramp(
    start: float, end: float, per_minute: float, size: float, doubling: float, cap: float = 1e3
) -> Traffic:
    """A loop that starts at ``per_minute`` and doubles every ``doubling`` seconds (agents
    spawning agents), up to ``cap`` times its starting rate."""
    t = start
    while t < end:
        multiple = min(2.0 ** ((t - start) / doubling), cap)
        yield t, size, 1
        t += size * MINUTE / (per_minute * multiple)


def daily_pulse(
    rng: random.Random, days: float, at: float, length: float, per_minute: float, size: float
) -> Traffic:
    """``length`` seconds of extra traffic at ``per_minute`` every day from ``at`` s past 00:00."""
    for day in range(math.ceil(days)):
        begin = day * DAY + at
        if begin < days * DAY:
            yield from poisson(rng, begin, begin + length, per_minute, size=size)


def _diurnal(t: float) -> float:
    """Relative activity of a service used by people: a working-day bump, quiet nights, and
    weekends at 40 %. Peaks near 1.0 on weekday afternoons, 0.05 at night."""
    hour = (t % DAY) / HOUR
    weekday = int(((START + t) // DAY + 3) % 7) < 5  # START is a Thursday (weekday 3)
    day_shape = math.exp(-(((hour - 14.0) / 4.5) ** 2))
    return (0.05 + 0.95 * day_shape) * (1.0 if weekday else 0.4)


# Mean amount per session-relative call: a session's scale (lognormal, mean 1) times the
# call's own draw (mean CALL_MEAN), both heavy-tailed.
CALL_MEAN = 4_000.0
CALL_SIGMA = 1.0
CALL_MAX = 200_000.0  # a call cannot send more than the model's context window
SESSION_SIGMA = 0.7
TURNS_MEAN = 8.0  # turns per session (geometric)
CALLS_PER_TURN = 4.0  # LLM calls per agent turn (geometric)
FAN_OUT = 0.05  # chance that a call fans out into 2-5 parallel calls
_CALLS_PER_SESSION = TURNS_MEAN * CALLS_PER_TURN * (1 - FAN_OUT + FAN_OUT * 3.5)
_MEAN_DIURNAL = sum(_diurnal(minute * MINUTE) for minute in range(7 * 1440)) / (7 * 1440)


def _geometric(rng: random.Random, mean: float) -> int:
    """1, 2, 3, ... with the given mean."""
    return 1 + int(math.log(1.0 - rng.random()) / math.log(1.0 - 1.0 / mean))


def _session(rng: random.Random, start: float) -> Iterator[tuple[float, float]]:
    """One person's session: agent turns (each a few LLM calls, one after another, the next
    sent when the previous answered) separated by the time a human takes to read and type;
    now and then a turn fans out into parallel calls (subagents)."""
    scale = _lognormal(rng, 1.0, SESSION_SIGMA)
    t = start
    for _ in range(_geometric(rng, TURNS_MEAN)):
        for _ in range(_geometric(rng, CALLS_PER_TURN)):
            fan_out = rng.randint(2, 5) if rng.random() < FAN_OUT else 1
            for _ in range(fan_out):
                amount = min(scale * _lognormal(rng, CALL_MEAN, CALL_SIGMA), CALL_MAX)
                yield t + rng.uniform(0, 0.5), amount
            t += _lognormal(rng, 8.0, 0.6)  # the call's latency before the next one
        t += _lognormal(rng, 60.0, 1.0)  # think time


def production(rng: random.Random, start: float, end: float, mean_per_minute: float) -> Traffic:
    """Synthetic code-assistant traffic averaging ``mean_per_minute`` over a week: sessions
    started by a Poisson process that follows ``_diurnal``."""
    # Sessions start at ``peak x _diurnal(t)`` a second (thinning: _diurnal <= 1).
    peak = mean_per_minute / (MINUTE * _CALLS_PER_SESSION * CALL_MEAN * _MEAN_DIURNAL)
    pending: list[tuple[float, float]] = []
    t = start
    while True:
        t += rng.expovariate(peak)
        while pending and pending[0][0] <= t:
            at, amount = heapq.heappop(pending)
            if at < end:
                yield at, amount, 0
        if t >= end:
            break
        if rng.random() < _diurnal(t):
            for call in _session(rng, t):
                heapq.heappush(pending, call)
    while pending:
        at, amount = heapq.heappop(pending)
        if at < end:
            yield at, amount, 0


def normal(*streams: Iterable[Call]) -> Traffic:
    """Streams merged in time order."""
    return heapq.merge(*streams, key=lambda call: call[0])


# -- scenarios -----------------------------------------------------------------------------------


# -- scenarios -----------------------------------------------------------------------------------

Phase = tuple[float, float]  # (start, end) of a loop, seconds from START


@dataclass(frozen=True)
class Scenario:
    """One row of the table (one per loop phase when it has several)."""

    name: str
    group: str  # "blind spot", "loop", "normal", "production", "production loop"
    days: float
    traffic: Callable[[random.Random], Traffic]
    loops: tuple[Phase, ...] = ()  # the loop phases, in order
    policy: dict[str, Any] = field(default_factory=dict)  # VelocityPolicy options
    forgive: bool = False  # the operator forgives the first trip (Fuse.forgive)
    stop: bool = True  # stop the replay once the last loop phase is refused


@dataclass
class Outcome:
    """What a replay saw. Times are seconds from START."""

    calls: int = 0
    recorded: int = 0  # calls the gate let through
    decisions: int = 0
    trips: list[tuple[float, str, int]] = field(default_factory=list)  # (t, reason, phase)
    false_trips: int = 0  # trips before the first loop started (all trips if none does)
    refused: dict[int, float] = field(default_factory=dict)  # phase -> its first refusal
    spent: dict[int, float] = field(default_factory=dict)  # phase -> its tokens until then
    errors: dict[int, str] = field(default_factory=dict)  # phase -> the refusal's message
    forgiven_at: float | None = None
    trips_after_forgive: int = 0


def replay(
    scenario: Scenario,
    seed: int = 0,
    *,
    days: float | None = None,
    fuse: Callable[[SimClock], Fuse] | None = None,
) -> Outcome:
    """Play ``scenario`` (its first ``days`` only, if given) through a fresh fuse."""
    clock = SimClock()
    if fuse is None:
        made = Fuse(MemoryStore(clock=clock), velocity=VelocityPolicy(**scenario.policy))
    else:
        made = fuse(clock)
    forgive = getattr(made, "forgive", None) if scenario.forgive else None
    end = (scenario.days if days is None else days) * DAY
    first_loop = scenario.loops[0][0] if scenario.loops else math.inf
    out = Outcome()
    for t, amount, phase in scenario.traffic(random.Random(seed)):
        if t >= end:
            break
        clock.now = START + t
        out.calls += 1
        out.decisions += 1
        gate = made.gate(KEY)
        if not gate.allowed:
            for p, (start, stop) in enumerate(scenario.loops, 1):
                if start <= t < stop and p not in out.refused:
                    out.refused[p] = t
                    out.errors[p] = str(gate.error)
            if forgive is not None and out.forgiven_at is None:
                forgive(KEY)
                out.forgiven_at = t
            if scenario.stop and len(out.refused) == len(scenario.loops) > 0:
                break
            continue
        out.recorded += 1
        out.decisions += 1
        decision = made.record(KEY, amount)
        if phase and phase not in out.refused:
            out.spent[phase] = out.spent.get(phase, 0.0) + amount
        if decision.tripped:
            out.trips.append((t, decision.error.reason if decision.error else "?", phase))
            out.false_trips += t < first_loop
            out.trips_after_forgive += out.forgiven_at is not None
    return out


WARM = 3.5 * DAY  # past the default learning period (3 days): the key is established


def steady(per_minute: float, size: float, days: float) -> Callable[[random.Random], Traffic]:
    """Independent calls of ``size`` tokens on average, ``per_minute`` in all."""
    return lambda rng: poisson(rng, 0.0, days * DAY, per_minute, size=size)


def looping(
    per_minute: float,
    size: float,
    multiple: float,
    loop_size: float | None = None,
    *,
    at: float = WARM,
    policy: dict[str, Any] | None = None,
) -> Scenario:
    """``steady`` traffic, then from ``at`` a loop that lifts the key to ``multiple`` times its
    rate for a day (the loop adds ``multiple - 1``), in calls of ``loop_size``."""
    days = at / DAY + 1

    def traffic(rng: random.Random) -> Traffic:
        background = poisson(rng, 0.0, days * DAY, per_minute, size=size)
        runaway = loop(at, at + DAY, per_minute * (multiple - 1), loop_size or size)
        return normal(background, runaway)

    return Scenario("", "loop", days, traffic, loops=((at, at + DAY),), policy=policy or {})


def named(scenario: Scenario, name: str, group: str | None = None) -> Scenario:
    return replace(scenario, name=name, group=group or scenario.group)


def scenarios(quick: bool = False) -> list[Scenario]:
    """The table's rows. ``quick`` replays 7 days instead of 30 for the normal profiles."""
    month = 7.0 if quick else 30.0
    rows: list[Scenario] = []
    add = rows.append

    # (1) large sparse calls on an established 2,000/min key (10 calls a minute of ~200)
    for every, size in ((70.0, 30_000.0), (70.0, 150_000.0), (61.0, 30_000.0)):
        multiple = size / every * MINUTE / 2_000
        add(
            named(
                looping(2_000, 200, 1 + multiple, size),
                f"(1) a {size / 1e3:,.0f}k call every {every:.0f} s ({multiple:.0f}x)",
                "blind spot",
            )
        )

    # (2) an 8x loop on a 300/min key for a day, then a 30x loop
    def sustained(rng: random.Random) -> Traffic:
        background = poisson(rng, 0.0, WARM + 2 * DAY, 300, size=100)
        eight = loop(WARM, WARM + DAY, 2_100, 100, 1)  # 7x on top of the key's own 1x
        thirty = loop(WARM + DAY, WARM + 2 * DAY, 8_700, 100, 2)
        return normal(background, eight, thirty)

    add(
        Scenario(
            "(2) 8x loop for a day, then 30x",
            "blind spot",
            WARM / DAY + 2,
            sustained,
            loops=((WARM, WARM + DAY), (WARM + DAY, WARM + 2 * DAY)),
        )
    )

    # (3) a new key looping just under the cold-start ceiling from its first call
    add(
        Scenario(
            "(3) new key at 95k/min",
            "blind spot",
            3.0,
            lambda rng: loop(0.0, 3 * DAY, 95_000, 3_000),
            loops=((0.0, 3 * DAY),),
        )
    )

    # (4) 200/min all day plus a 20-minute batch at 10,000/min every night at 02:00
    add(
        Scenario(
            "(4) nightly 20-min batch at 50x, forgiven once",
            "blind spot",
            14.0,
            lambda rng: normal(
                poisson(rng, 0.0, 14 * DAY, 200, size=100),
                daily_pulse(rng, 14, 2 * HOUR, 20 * MINUTE, 10_000, 500),
            ),
            forgive=True,
            stop=False,
        )
    )

    # (5) and the other loops: calls of 100 tokens on a 300/min key (3 calls a minute)
    for multiple in (12, 15, 30, 100):
        label = "(5) " if multiple == 12 else ""
        add(named(looping(300, 100, multiple), f"{label}{multiple}x loop, 300/min key"))
    add(named(looping(3_000, 100, 12), "12x loop, 3,000/min key (30 calls/min)"))
    for doubling in (2.0, 10.0):
        add(
            Scenario(
                f"ramp doubling every {doubling:.0f} min",
                "loop",
                WARM / DAY + 1,
                lambda rng, d=doubling: normal(
                    poisson(rng, 0.0, WARM + DAY, 300, size=100),
                    ramp(WARM, WARM + DAY, 300, 100, d * MINUTE),
                ),
                loops=((WARM, WARM + DAY),),
            )
        )

    # normal profiles: every trip is a false trip
    def profile(name: str, traffic: Callable[[random.Random], Traffic]) -> None:
        add(Scenario(name, "normal", month, traffic))

    profile("steady 300/min", steady(300, 100, month))
    profile(
        "office hours (weekdays 09-17)",
        lambda rng: poisson(rng, 0.0, month * DAY, _office(1_000), size=200),
    )
    profile(
        "batch: 1,000/min + 2 h at 5x nightly",
        lambda rng: normal(
            poisson(rng, 0.0, month * DAY, 1_000, size=200),
            daily_pulse(rng, month, 2 * HOUR, 2 * HOUR, 4_000, 400),
        ),
    )
    profile(
        "sessions (~1,500/min avg, bursty)",
        lambda rng: production(rng, 0.0, month * DAY, 1_500),
    )
    profile(
        "slow growth 8 %/day from 300/min",
        lambda rng: poisson(
            rng, 0.0, month * DAY, lambda t: 300 * 1.08 ** (t / DAY), size=100, step=HOUR
        ),
    )
    profile(
        "daily 40k document on 1,000/min",
        lambda rng: normal(
            poisson(rng, 0.0, month * DAY, 1_000, size=200),
            ((d * DAY + 13 * HOUR, 40_000.0, 0) for d in range(int(month))),
        ),
    )
    for per_minute, size in ((2_000, 200), (300, 100)):
        profile(
            f"legit 6x surge for 2 days, {per_minute:,}/min key",
            lambda rng, r=per_minute, s=size: poisson(
                rng, 0.0, month * DAY, _surge(r, 4.5 * DAY, 2 * DAY), size=s, step=MINUTE
            ),
        )

    # (6) synthetic production traffic at several key sizes, from the key's first call
    for mean in (1_000, 15_000, 60_000):
        add(
            Scenario(
                f"(6) production, {mean:,}/min avg",
                "production",
                month,
                lambda rng, m=mean: production(rng, 0.0, month * DAY, m),
            )
        )

    # (7) a loop at 12x a production key's average (the loop adds 11x), established key
    for mean in (1_000, 15_000, 60_000):
        for seed in range(3):
            at = 7 * DAY + (9 + 5 * seed) * HOUR  # 09:00, 14:00 and 19:00 on a Thursday
            add(
                Scenario(
                    f"(7) 12x-average loop, {mean:,}/min avg #{seed + 1}",
                    "production loop",
                    8.0,
                    lambda rng, m=mean, a=at: normal(
                        production(rng, 0.0, 8 * DAY, m), loop(a, a + 6 * HOUR, 11 * m, CALL_MEAN)
                    ),
                    loops=((at, at + 6 * HOUR),),
                )
            )
    return rows


def _office(per_minute: float) -> Callable[[float], float]:
    def rate(t: float) -> float:
        hour = (t % DAY) / HOUR
        weekday = int(((START + t) // DAY + 3) % 7) < 5
        return per_minute if weekday and 9 <= hour < 17 else 0.0

    return rate


def _surge(per_minute: float, at: float, length: float) -> Callable[[float], float]:
    return lambda t: per_minute * (6.0 if at <= t < at + length else 1.0)
