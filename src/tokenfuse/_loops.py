"""The failure-loop breaker as both integrations use it: a policy, and two steps on a fuse.

``LoopBreaker.check`` before a call (is this call refused as a loop? it counts a send, unless
the caller counts it after the call) and ``note`` after it (a failure, or the end of the
failures; with ``send``, the send too) are each one store operation (``CheckLoops``,
``NoteLoop``), run through the fuse like its own steps: the identity is the fuse's storage
key, a store that fails is failed open (or closed) and counted by the fuse, the decision is
counted by the metrics, and the verdicts become ``FailureLoop`` refusals and
``failure_loop`` / ``repeat_loop`` events. The operations are values, so a caller that runs
other steps before or after the same call can send them together (``store.run_many``): a
``LoopNote`` is a note made to go later, with the call's record in one pipeline, or with other
calls' notes in a background batch (``LoopNotes``: one ``NoteLoopBatch`` per identity).

The rule and the fingerprint are the core's (``_core/loops.py``); the user's guide is
docs/guards.md#failure-loop-breaker.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from time import perf_counter
from typing import Any, Literal

from ._core.loops import LoopPolicy, LoopVerdict, fingerprint
from ._errors import ConfigurationError, FailureLoop
from ._events import FuseEvent
from ._fuse import Decision, Fuse, default_fuse
from ._identity import Identity
from ._observe import WATCHERS, decided, loop_passed
from ._stores.ops import CheckLoops, ForgetLoops, NoteLoop, NoteLoopBatch

__all__ = [
    "CallName",
    "FailureLoopPolicy",
    "LoopBreaker",
    "LoopCheck",
    "LoopNote",
    "LoopNotes",
    "aforget_loops",
    "forget_loops",
]

OnRepeat = Literal["event", "refuse"]


@dataclass(frozen=True, slots=True)
class FailureLoopPolicy:
    """When the same call is a loop. ``FuseTransport(failure_loops=None)`` turns it off.

    >>> FailureLoopPolicy(failures=5, window=300).failures
    5

    Args:
        failures: failures of the same call (same method, path and normalised body) within
            ``window`` seconds that trip it.
        window: seconds the failures are counted over, from the first.
        cooldown: seconds a tripped call is refused (default: ``window``); afterwards its
            count starts again from nothing. A trip within an hour of the same call's previous
            one doubles it, up to ``cooldown_max`` (default: an hour, or ``cooldown`` if
            longer).
        repeats: sends of the same call within ``repeat_window`` seconds that make a repeat
            loop, failing or not.
        repeat_window: seconds the sends are counted over, from the first.
        on_repeat: ``"event"`` reports a repeat loop (a ``repeat_loop`` event, the call goes
            on); ``"refuse"`` refuses the call that makes it, and every same call until the
            window has passed. Outbound, "event" counts each send after the call, with its
            note (no round trip before it where the store's open-key view answers); "refuse"
            must count it before the call: a store round trip before every call.
        tool_failures: (outbound) a request whose conversation shows the model asking for the
            same tool call with the same arguments this many times in a row, each answered
            with an error, is refused (``tool_loop``).
        tool_alternations: likewise for two failing tool calls taking turns (A, B, A, B is 2).
        max_calls: calls remembered per identity (the least recently seen go first).
    """

    failures: int = 3
    window: float = 120.0
    cooldown: float | None = None
    cooldown_max: float | None = None
    repeats: int = 5
    repeat_window: float = 60.0
    on_repeat: OnRepeat = "event"
    tool_failures: int = 3
    tool_alternations: int = 2
    max_calls: int = 16
    core: LoopPolicy = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.on_repeat not in ("event", "refuse"):
            raise ConfigurationError(
                f'on_repeat must be "event" or "refuse", not {self.on_repeat!r}'
            )
        for name, least in (("tool_failures", 2), ("tool_alternations", 2)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= 1000:
                raise ConfigurationError(
                    f"{name} must be an integer from {least} to 1000, not {value!r}"
                )
        cooldown = self.window if self.cooldown is None else self.cooldown
        try:
            core = LoopPolicy(
                failures=self.failures,
                failure_window=self.window,
                cooldown=cooldown,
                cooldown_max=_cooldown_max(self.cooldown_max, cooldown),
                repeats=self.repeats,
                repeat_window=self.repeat_window,
                refuse_repeats=self.on_repeat == "refuse",
                max_calls=self.max_calls,
            )
        except ConfigurationError as exc:  # named as this policy names it
            raise ConfigurationError(str(exc).replace("failure_window", "window")) from None
        object.__setattr__(self, "core", core)


def _cooldown_max(given: float | None, cooldown: float) -> float:
    if given is not None:
        return given
    if isinstance(cooldown, (int, float)) and not isinstance(cooldown, bool):
        return max(3_600.0, float(cooldown))
    return 3_600.0  # a bad cooldown: LoopPolicy names it


# Not frozen: made for every call, and a frozen dataclass pays a setattr per field.
@dataclass(slots=True)
class CallName:
    """What a call is to the breaker: its fingerprint, and how messages name it."""

    fingerprint: str
    method: str
    path: str

    @staticmethod
    def of(
        secret: bytes,
        method: str,
        host: str,
        path: str,
        body: bytes | None,
        parsed: tuple[bool, Any] | None = None,
        shown: str | None = None,
    ) -> CallName:
        """``shown``: the path as messages show it, when ``path`` holds more (a query)."""
        mark = fingerprint(secret, method, host, path, body, parsed)
        return CallName(mark, method.upper(), _shown_path(path if shown is None else shown))

    @property
    def label(self) -> str:
        """``POST /v1/chat/completions #3f9a0c12``: never the body, only its hash's start."""
        return f"{self.method} {self.path} #{self.fingerprint[:8]}"


@functools.lru_cache(maxsize=1024)
def _shown_path(path: str) -> str:
    # A path is the application's, but it may carry an id; keep it short and printable.
    shown = "".join(ch if ch.isprintable() else "?" for ch in path[:120])
    return shown or "/"


def plain(verdict: LoopVerdict) -> bool:
    """Whether a verdict has nothing to refuse nor to report (most calls)."""
    return verdict.allowed and not verdict.tripped and not verdict.repeated


class _Judge:
    """Turns one verdict into a decision (and events), keeping the verdict for the caller."""

    __slots__ = ("breaker", "call", "report", "tool", "verdict")

    def __init__(
        self, breaker: LoopBreaker, call: CallName, tool: str | None, report: bool = True
    ) -> None:
        self.breaker = breaker
        self.call = call
        self.tool = tool
        self.report = report  # report repeats (inbound does not: see _middleware/loops.py)
        self.verdict: LoopVerdict | None = None

    def __call__(self, identity: Identity, verdict: LoopVerdict) -> Decision:
        self.verdict = verdict
        breaker = self.breaker
        key_id = breaker.fuse._id(identity)
        limit = float(breaker.limit_of(verdict.reason))
        if plain(verdict):
            # Nothing to refuse nor to report (most calls): no refusal made, no event.
            return Decision(
                key=identity.label, key_id=key_id, allowed=True, rate=verdict.count, limit=limit
            )
        error = breaker.refusal(identity, self.call, verdict, self.tool)
        self._report(identity, verdict, key_id, error)
        # A trip refuses, as a velocity record's does: the call went through, the next won't.
        refused = not verdict.allowed or verdict.tripped
        return Decision(
            key=identity.label,
            key_id=key_id,
            allowed=not refused,
            error=error if refused else None,
            tripped=verdict.tripped,
            rate=verdict.count,
            limit=limit,
        )

    def _report(
        self, identity: Identity, verdict: LoopVerdict, key_id: str, error: FailureLoop
    ) -> None:
        """The events of a verdict that refuses, trips or repeats (``error``: its refusal)."""
        breaker = self.breaker
        if verdict.tripped:
            breaker.emit("failure_loop", identity, key_id, error)
            if verdict.repeated and self.report:  # a note whose send also made a repeat loop
                repeat = replace(verdict, reason="repeat_loop", tripped=False, retry_after=0.0,
                                 count=float(breaker.policy.repeats),
                                 window=float(breaker.policy.repeat_window))  # fmt: skip
                repeat_error = breaker.refusal(identity, self.call, repeat, self.tool)
                breaker.emit("repeat_loop", identity, key_id, repeat_error)
        elif verdict.repeated and self.report:
            breaker.emit("repeat_loop", identity, key_id, error)
        elif (
            not verdict.allowed
            and verdict.reason == "repeat_loop"
            and verdict.count == breaker.policy.repeats
            and self.report
        ):
            breaker.emit("repeat_loop", identity, key_id, error)  # the first refusal only


class LoopCheck:
    """A call's failure-loop check, prepared to go in one pipeline with the caller's other
    steps: the transport's gate (``Fuse.gate_with``), the middleware's admission
    (``Fuse.admit_with``). Made by ``LoopBreaker.prepare``, decided by ``concluded``."""

    __slots__ = ("body", "call", "op", "started")

    def __init__(self, call: CallName, op: CheckLoops, started: float) -> None:
        self.call = call
        self.op = op
        self.started = started  # for the decision's duration metric (0: nobody watches)
        #: The request body as parsed for the fingerprint (None: not JSON, or not parsed),
        #: for the call's other steps that read it (the run budgets' estimate): one parse.
        self.body: Any = None


class LoopNote:
    """A call's note (``NoteLoop``), made after the call and sent when it suits the caller:
    alone (``send``), in the pipeline of the call's record (``op``, then ``decided`` with its
    result), or in a background batch (``LoopNotes``). Made by ``LoopBreaker.later``."""

    __slots__ = ("breaker", "call", "identity", "op", "started")

    def __init__(
        self, breaker: LoopBreaker, identity: Identity, call: CallName, op: NoteLoop
    ) -> None:
        self.breaker = breaker
        self.identity = identity
        self.call = call
        self.op = op
        self.started = perf_counter() if WATCHERS.decisions else 0.0

    def decided(self, verdict: LoopVerdict | None) -> Decision | None:
        """The decision on the verdict the note got in a shared pipeline (with the call's
        record, or in a batch), when it has something to say: a trip or a repeat loop (its
        event, its metrics, as a note sent alone). None for the others, which the store has
        counted, all they are for: like a run's settlements riding with a record, or a
        batch's records, they are not decided one by one. None too when the store was not
        asked or failed (the pipeline's first decision counted that)."""
        if verdict is None or not (verdict.tripped or verdict.repeated or not verdict.allowed):
            return None
        judge = _Judge(self.breaker, self.call, None)
        return self.breaker.fuse._conclude(self.identity, self.op, judge, verdict, self.started)

    def send(self) -> Decision:
        """Send the note alone (a round trip). Never raises unless the fuse fails closed."""
        judge = _Judge(self.breaker, self.call, None)
        return self.breaker.fuse._decide(self.identity, self.op, judge)

    async def asend(self) -> Decision:
        judge = _Judge(self.breaker, self.call, None)
        return await self.breaker.fuse._adecide(self.identity, self.op, judge)


class LoopNotes:
    """Notes of many calls sent together (the background recorder's batch): one
    ``NoteLoopBatch`` per identity (``ops``), its notes in order, decided by ``decided``."""

    __slots__ = ("groups", "ops")

    def __init__(self, notes: Sequence[LoopNote]) -> None:
        groups: dict[tuple[int, str], list[LoopNote]] = {}
        for note in notes:
            group = groups.setdefault((id(note.breaker), note.op.key), [])
            group.append(note)
        self.groups = list(groups.values())
        self.ops = [
            NoteLoopBatch(group[0].op.key, group[0].op.policy, tuple(n.op for n in group))
            for group in self.groups
        ]

    def decided(self, results: Sequence[Any] | None) -> None:
        """Decide the notes on their batches' verdicts (``LoopNote.decided``: only a trip or
        a repeat loop is decided; None: the store failed, as counted by the batch's first
        decision)."""
        if results is None:
            return
        for group, verdicts in zip(self.groups, results, strict=True):
            for note, verdict in zip(group, verdicts, strict=True):
                note.decided(verdict)


class LoopBreaker:
    """The breaker's steps for one fuse and policy (the transport's and the middleware's)."""

    def __init__(self, fuse: Fuse, policy: FailureLoopPolicy) -> None:
        self.fuse = fuse
        self.policy = policy
        self.core = policy.core
        # Tool-call loops are refused on every request that shows them, with no store to say
        # "reported already": one event per call a minute, in this process (bounded).
        self._tool_events = _OncePer(_TOOL_EVENT_EVERY, _TOOL_EVENT_KEYS)

    def name(
        self,
        method: str,
        host: str,
        path: str,
        body: bytes | None,
        parsed: tuple[bool, Any] | None = None,
        shown: str | None = None,
    ) -> CallName:
        """The call's fingerprint under the fuse's secret, and its printable name (``shown``:
        the path to show, when ``path`` holds a query, which may carry a credential)."""
        return CallName.of(self.fuse._secret, method, host, path, body, parsed, shown)

    # -- the operations: values, for a caller that runs them with others -------------------

    def check_op(self, identity: Identity, call: CallName, local: bool = False) -> CheckLoops:
        """``local``: the caller asks only "is this call tripped?" (``CheckLoops.local``)."""
        return CheckLoops(self.fuse._key(identity), call.fingerprint, self.core, local)

    def note_op(
        self,
        identity: Identity,
        call: CallName,
        failed: bool | None,
        status: int,
        error: str,
        send: bool = False,
        key: str | None = None,
    ) -> NoteLoop:
        """``send``: count the call as a send (its check did not: ``local``); ``failed`` None:
        count no outcome (an SDK's retry, its failure counted already). ``key``: the
        identity's store key, when the caller has it (its check's ``op.key``)."""
        if key is None:
            key = self.fuse._key(identity)
        return NoteLoop(key, call.fingerprint, self.core, failed, status, error, send)

    # -- the steps ---------------------------------------------------------------------------

    def check(
        self,
        identity: Identity,
        call: CallName,
        tool: str | None = None,
        report: bool = True,
        op: CheckLoops | None = None,
    ) -> tuple[Decision, LoopVerdict | None]:
        """Before the call: the decision (refused: ``error`` is a ``FailureLoop``), and the
        verdict (None when the store was not asked: failed open). ``report=False``: no
        ``repeat_loop`` event for this call (one clients poll). ``op``: the check, when the
        caller made it (``check_op``)."""
        judge = _Judge(self, call, tool, report)
        check = op if op is not None else self.check_op(identity, call)
        decision = self.fuse._decide(identity, check, judge)
        return decision, judge.verdict

    async def acheck(
        self,
        identity: Identity,
        call: CallName,
        tool: str | None = None,
        report: bool = True,
        op: CheckLoops | None = None,
    ) -> tuple[Decision, LoopVerdict | None]:
        judge = _Judge(self, call, tool, report)
        check = op if op is not None else self.check_op(identity, call)
        decision = await self.fuse._adecide(identity, check, judge)
        return decision, judge.verdict

    def prepare(
        self, identity: Identity, call: CallName, local: bool = False, op: CheckLoops | None = None
    ) -> LoopCheck:
        """The call's check, to run with the caller's other steps (``concluded`` decides).
        ``op``: its operation, when the caller has it (``check_op``; the middleware keeps
        those of bodiless calls)."""
        started = perf_counter() if WATCHERS.decisions else 0.0
        if op is None:
            op = self.check_op(identity, call, local)
        return LoopCheck(call, op, started)

    def concluded(
        self, identity: Identity, check: LoopCheck, verdict: Any, report: bool = True
    ) -> Decision:
        """``check``'s decision on the verdict its op got in the shared pipeline; ``report``:
        as ``check``'s."""
        judge = _Judge(self, check.call, None, report)
        return self.fuse._conclude(identity, check.op, judge, verdict, check.started)

    def passed(self, identity: Identity, check: LoopCheck, verdict: LoopVerdict) -> None:
        """``concluded`` for a verdict with nothing to refuse nor to report (``plain``), for a
        caller that needs no decision (the middleware): observers count it as ``concluded``
        reports it, a ``Decision`` made only for one that needs it (``_observe.loop_passed``).
        The store's health is left alone: the step the check rode with (the admission) has
        just recorded that the store answered."""
        watchers = WATCHERS.decisions
        if watchers and check.started:
            seconds = perf_counter() - check.started

            def decision() -> Decision:  # for an observer with no ``loop_passed``
                limit = float(self.limit_of(verdict.reason))
                return Decision(key=identity.label, key_id=self.fuse._id(identity),
                                allowed=True, rate=verdict.count, limit=limit)  # fmt: skip

            loop_passed(watchers, self.fuse, check.op, decision, seconds)

    def note(
        self, identity: Identity, call: CallName, failed: bool, status: int = 0, error: str = ""
    ) -> Decision:
        """After the call: count its failure, or end its failures. Never raises unless the
        fuse fails closed (and then only ``StoreUnavailable``)."""
        op = self.note_op(identity, call, failed, status, error)
        return self.fuse._decide(identity, op, _Judge(self, call, None))

    async def anote(
        self, identity: Identity, call: CallName, failed: bool, status: int = 0, error: str = ""
    ) -> Decision:
        op = self.note_op(identity, call, failed, status, error)
        return await self.fuse._adecide(identity, op, _Judge(self, call, None))

    def later(
        self,
        identity: Identity,
        call: CallName,
        failed: bool | None,
        status: int = 0,
        error: str = "",
        send: bool = False,
        key: str | None = None,
    ) -> LoopNote:
        """A note made now, to send later or with other ops (``LoopNote``); ``key`` as
        ``note_op``'s."""
        op = self.note_op(identity, call, failed, status, error, send, key)
        return LoopNote(self, identity, call, op)

    # -- refusals and events -------------------------------------------------------------------

    def limit_of(self, reason: str | None) -> int:
        return self.policy.repeats if reason == "repeat_loop" else self.policy.failures

    def refusal(
        self, identity: Identity, call: CallName, verdict: LoopVerdict, tool: str | None
    ) -> FailureLoop:
        reason = verdict.reason or ("repeat_loop" if verdict.repeated else "failure_loop")
        return FailureLoop(
            key=identity.label,
            key_id=self.fuse.key_id(identity),
            call=call.label,
            fingerprint=call.fingerprint,
            tool=tool,
            count=verdict.count,
            limit=float(self.limit_of(reason)),
            window=verdict.window,
            retry_after=max(verdict.retry_after, 0.0),
            status=int(verdict.status) or None,
            error=verdict.error or None,
            reason=reason,
            store_key=self.fuse._key(identity),
        )

    def tool_refusal(
        self, identity: Identity, call: CallName, tool: str, count: int, error: str
    ) -> Decision:
        """A refusal found in the request itself (``tool_history``): no store was asked. It is
        reported and counted like the store's refusals."""
        error_ = FailureLoop(
            key=identity.label,
            key_id=self.fuse.key_id(identity),
            call=call.label,
            fingerprint=call.fingerprint,
            tool=tool,
            count=float(count),
            limit=float(self.policy.tool_failures),
            window=0.0,
            retry_after=0.0,
            error=error or None,
            reason="tool_loop",
        )
        key_id = self.fuse.key_id(identity)
        if self._tool_events.take(f"{key_id}:{call.fingerprint}"):
            self.emit("failure_loop", identity, key_id, error_)
        decision = Decision(
            key=identity.label,
            key_id=key_id,
            allowed=False,
            error=error_,
            rate=float(count),
            limit=float(self.policy.tool_failures),
        )
        watchers = WATCHERS.decisions
        if watchers:
            decided(watchers, self.fuse, self.check_op(identity, call), decision, 0.0)
        return decision

    def emit(self, kind: Literal["failure_loop", "repeat_loop"], identity: Identity,
             key_id: str, error: FailureLoop) -> None:  # fmt: skip
        event = FuseEvent(
            kind, identity.label, str(error), error, key_id=key_id, fuse=self.fuse.name
        )
        self.fuse.hooks.emit(event, logging.WARNING)


def _forget_op(who: str | Identity | FailureLoop, fuse: Fuse) -> tuple[ForgetLoops, str, str]:
    """The operation forgetting ``who``'s calls (or the one call a refusal names), with the
    label and key id its event names."""
    if isinstance(who, FailureLoop):
        if not who.store_key:
            raise ConfigurationError("this FailureLoop names no stored call (a tool_loop)")
        return ForgetLoops(who.store_key, who.fingerprint), who.key, who.key_id or "?"
    identity = Identity.of(who)
    return ForgetLoops(fuse._key(identity)), identity.label, fuse.key_id(identity)


#: A tool-call loop of one call is reported at most once a minute (per process).
_TOOL_EVENT_EVERY = 60.0
_TOOL_EVENT_KEYS = 1_024


class _OncePer:
    """At most one ``take`` a period per name, for at most ``names`` names (the oldest go)."""

    def __init__(self, period: float, names: int) -> None:
        self.period = period
        self.names = names
        self._last: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, name: str) -> bool:
        now = time.monotonic()
        with self._lock:
            last = self._last.get(name)
            if last is not None and now - last < self.period:
                return False
            self._last[name] = now
            self._last.move_to_end(name)
            while len(self._last) > self.names:
                self._last.popitem(last=False)
            return True


def forget_loops(who: str | Identity | FailureLoop, *, fuse: Fuse | None = None) -> int:
    """Let calls through the failure-loop breaker again, now, for every process sharing the
    store: every recent call of ``who`` (a name, an ``Identity``), or the one call a
    ``FailureLoop`` refused. Returns how many calls were forgotten. ``fuse`` is the one the
    transport or middleware counts in (default: ``default_fuse()``).

    >>> try:                                                     # doctest: +SKIP
    ...     client.chat.completions.create(...)
    ... except tokenfuse.FailureLoop as loop:
    ...     fix_the_cause(loop)
    ...     tokenfuse.forget_loops(loop)
    1
    """
    fuse = fuse if fuse is not None else default_fuse()
    op, label, key_id = _forget_op(who, fuse)
    forgotten: int = fuse._sync().run(op)
    _forgotten(fuse, label, key_id, forgotten)
    return forgotten


async def aforget_loops(who: str | Identity | FailureLoop, *, fuse: Fuse | None = None) -> int:
    """``forget_loops`` for asyncio code."""
    fuse = fuse if fuse is not None else default_fuse()
    op, label, key_id = _forget_op(who, fuse)
    forgotten: int = await fuse._async().arun(op)
    _forgotten(fuse, label, key_id, forgotten)
    return forgotten


def _forgotten(fuse: Fuse, label: str, key_id: str, count: int) -> None:
    detail = f"key {label} [id {key_id}]: {count} call(s) forgotten by the loop breaker"
    fuse.hooks.emit(FuseEvent("reset", label, detail, key_id=key_id, fuse=fuse.name))
