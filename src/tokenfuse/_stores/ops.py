"""The operations a store runs: each one a small value, ``store.run(op)`` (or ``arun``).

One class per operation, named like its Lua script (``lua/<name>.lua``): what the operation
needs travels in the value, and each store says in one place how it runs it (``MemoryStore``
applies the pure core, ``RedisStore`` encodes the value for its script and decodes the reply).
``Op[R]`` carries the type of the result, so ``store.run(Gate(key))`` is a ``VelocityVerdict``.

``key`` is already storage-safe (``Fuse`` hashes identities and adds its name). One operation
is about many keys: ``ListKeys``, whose ``key`` is the start that their keys share.

>>> MemoryStore().run(Record("default:agent-42", 1_200.0, VelocityPolicy())).rate  # doctest: +SKIP
1200.0
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Generic, TypeVar

from .._core.admission import AdmitVerdict
from .._core.bucket import BucketPolicy, BucketState
from .._core.budget import RunState, RunVerdict
from .._core.lease import LeaseVerdict
from .._core.loops import LoopPolicy, LoopVerdict
from .._core.status import Status
from .._core.velocity import VelocityPolicy, VelocityState, VelocityVerdict

__all__ = [
    "UNSET",
    "Admit",
    "CheckLoops",
    "Configure",
    "ForgetLoops",
    "Forgive",
    "Gate",
    "KeyPage",
    "Lease",
    "ListKeys",
    "NoteLoop",
    "NoteLoopBatch",
    "Op",
    "OpenRun",
    "ReadRun",
    "ReadState",
    "ReadStatus",
    "Record",
    "RecordBatch",
    "Reserve",
    "Reset",
    "ReturnLease",
    "Settle",
    "StoredState",
    "Unset",
]

R = TypeVar("R", covariant=True)


class Unset:
    """Marker for 'leave this setting as it is' in ``Configure``."""

    _instance: Unset | None = None

    def __new__(cls) -> Unset:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNSET"


UNSET = Unset()


class Op(Generic[R]):
    """An operation on one key whose result is an ``R``."""

    __slots__ = ()
    name: ClassVar[str]
    """The operation's name: its Lua script's, and what a store's errors call it."""
    key: str


# The operations are values: built once per guarded call, never changed afterwards. They are
# not frozen, as frozen dataclasses pay an object.__setattr__ per field on every construction.


@dataclass(slots=True)
class Gate(Op[VelocityVerdict]):
    """Is the key open? Read-only: a refused call spends nothing (``velocity.gate``)."""

    name: ClassVar[str] = "gate"
    key: str


@dataclass(slots=True)
class Record(Op[VelocityVerdict]):
    """Add ``amount`` to the key's window and judge the new rate (``velocity.record``)."""

    name: ClassVar[str] = "record"
    key: str
    amount: float
    velocity: VelocityPolicy


@dataclass(slots=True)
class RecordBatch(Op[VelocityVerdict]):
    """Several ``Record`` of one key in one step, in order and at one ``now``: the usage of
    calls recorded off the caller's path, sent together. The verdict is the first trip's, or
    else the last record's (``velocity.record`` for each amount)."""

    name: ClassVar[str] = "record_batch"
    key: str
    amounts: tuple[float, ...]
    velocity: VelocityPolicy


@dataclass(slots=True)
class Admit(Op[AdmitVerdict]):
    """Decide one inbound call: latch, then bucket (``cost``), then velocity (``amount``;
    0 checks the latch only). A policy that is None is not checked (``admission.admit``)."""

    name: ClassVar[str] = "admit"
    key: str
    cost: float
    amount: float
    velocity: VelocityPolicy | None
    bucket: BucketPolicy | None


@dataclass(slots=True)
class Lease(Op[LeaseVerdict]):
    """Renew a process's lease of the key's bucket: give back its ``give_back`` unspent
    tokens and record the velocity amounts of the calls it admitted (``pending``, in order),
    then decide this call as ``Admit`` does and, if allowed, take up to ``want`` more tokens
    for the new lease (``lease.grant``)."""

    name: ClassVar[str] = "lease"
    key: str
    cost: float
    amount: float
    want: float
    give_back: float
    pending: tuple[float, ...]
    velocity: VelocityPolicy | None
    bucket: BucketPolicy | None


@dataclass(slots=True)
class ReturnLease(Op[VelocityVerdict | None]):
    """Close a lease: give back its unspent tokens and record the velocity amounts of the
    calls it admitted; the first trip among them, or None (``lease.settle``)."""

    name: ClassVar[str] = "return_lease"
    key: str
    give_back: float
    pending: tuple[float, ...]
    velocity: VelocityPolicy | None
    bucket: BucketPolicy | None


@dataclass(slots=True)
class ReadStatus(Op[Status]):
    """The key's status under these policies, read without changing anything."""

    name: ClassVar[str] = "status"
    key: str
    velocity: VelocityPolicy
    bucket: BucketPolicy | None


@dataclass(slots=True)
class Reset(Op[None]):
    """Close the key at once, forget its window and escalation, refill its bucket. What it
    learned and its live overrides stay (``velocity.reset``)."""

    name: ClassVar[str] = "reset"
    key: str


@dataclass(slots=True)
class Forgive(Op[None]):
    """Close the key at once and teach that the rate of its last trip is normal at that hour
    of day, so the same traffic passes there from now on (``velocity.forgive``)."""

    name: ClassVar[str] = "forgive"
    key: str


@dataclass(slots=True)
class Configure(Op[None]):
    """Set the key's live overrides, read by every process with its next decision: ``None``
    clears one (the policy's value applies again), ``UNSET`` leaves it as it is."""

    name: ClassVar[str] = "configure"
    key: str
    limit: float | None | Unset = UNSET
    capacity: float | None | Unset = UNSET
    rate: float | None | Unset = UNSET


@dataclass(frozen=True, slots=True)
class KeyPage:
    """One page of ``ListKeys``: each key's status (its ``key`` the storage key) and where
    the next page starts (``""``: this was the last)."""

    statuses: list[Status] = field(default_factory=list)
    cursor: str = ""


@dataclass(slots=True)
class ListKeys(Op[KeyPage]):
    """The status of the keys starting with ``key`` (a fuse's ``"name:"``, maybe with the
    start of a key id after it), a page of about ``count`` at a time, in no useful order.

    Read-only and made for operators, not the hot path: nothing is indexed for it, so it walks
    the store (``SCAN`` on every primary of a Redis Cluster). A key created or removed while
    the pages are walked may be listed or not, and Redis may list a key on two pages.
    """

    name: ClassVar[str] = "list"
    key: str
    velocity: VelocityPolicy
    bucket: BucketPolicy | None
    cursor: str = ""
    """Where to go on: ``""`` for the first page, else the previous page's ``cursor``."""
    count: int = 500


# -- reading state for operators: what the admin pages and the CLI show -------------------------


@dataclass(slots=True)
class StoredState:
    """One key's state as the store holds it, read at ``now`` (the store's clock): a copy,
    so the caller may look at it at leisure. None where the key has no such state."""

    key: str
    now: float
    velocity: VelocityState | None
    bucket: BucketState | None


@dataclass(slots=True)
class ReadState(Op[StoredState]):
    """The key's state itself, read without changing anything (``status.lua`` again: the same
    read as ``ReadStatus``, for a view of more than the status: the window slot by slot)."""

    name: ClassVar[str] = "status"
    key: str


# -- the failure-loop breaker: an identity's recent calls, kept beside its state ----------------
# ``key`` is the identity's storage key, as for the operations above; each store keeps the
# calls apart from the identity's other state (``RedisStore``: ``<prefix>:loops:{<key>}``).


@dataclass(slots=True)
class CheckLoops(Op[LoopVerdict]):
    """Before a call: is this call (``fingerprint``) refused as a loop? Counts it as a send,
    which may make it a repeat loop (``loops.check``), unless ``local``."""

    name: ClassVar[str] = "check_loops"
    key: str
    fingerprint: str
    policy: LoopPolicy
    local: bool = False
    """The caller asks only "is this call tripped?": no store counts a send or changes
    anything (the send is counted after the call, ``NoteLoop.send``), so a store that keeps a
    local view of the tripped calls (``RedisStore``: ``open_keys``) answers it without a
    round trip. Set when repeats are not refused (``on_repeat="event"``): by the transport,
    and by the middleware in lease mode."""


@dataclass(slots=True)
class NoteLoop(Op[LoopVerdict]):
    """After a call: count its send (``send``: its check counted none), then its failure
    (``status`` and ``error`` say what failed), or end its failures (``failed`` False), or
    neither (``failed`` None: an SDK's retry, whose failure counted already); the failure
    that reaches the policy's count trips it (``loops.note``)."""

    name: ClassVar[str] = "note_loop"
    key: str
    fingerprint: str
    policy: LoopPolicy
    failed: bool | None
    status: int = 0
    error: str = ""
    send: bool = False


@dataclass(slots=True)
class NoteLoopBatch(Op[list[LoopVerdict]]):
    """Several ``NoteLoop`` of one key (``notes``, each with this ``key`` and ``policy``) in
    one step, in order and at one ``now``: the notes of calls recorded off the caller's path,
    sent together. One verdict per note, in order."""

    name: ClassVar[str] = "note_loop_batch"
    key: str
    policy: LoopPolicy
    notes: tuple[NoteLoop, ...]


@dataclass(slots=True)
class ForgetLoops(Op[int]):
    """Forget one call of the identity (``fingerprint``), or every call (``""``): reopen what
    the breaker refuses. The number of calls forgotten (``loops.forget``)."""

    name: ClassVar[str] = "forget_loops"
    key: str
    fingerprint: str = ""


# -- run budgets: one key per run, ``run:<keyed hash of the run id>`` (``_core/budget``) --------
# ``ttl`` is the run's own: its state expires that many seconds after its last write.


@dataclass(slots=True)
class OpenRun(Op[RunVerdict]):
    """Open the run with its limits (-1: none in that unit), or ``join`` it: keep the limits
    it has, as a subagent in another process does (``budget.open_run``)."""

    name: ClassVar[str] = "run_open"
    key: str
    token_limit: float
    usd_limit: float
    ttl: float
    join: bool = False


@dataclass(slots=True)
class Reserve(Op[RunVerdict]):
    """Hold a call's estimate before it is sent, or refuse it (``budget.reserve``)."""

    name: ClassVar[str] = "run_reserve"
    key: str
    tokens: float
    usd: float
    ttl: float


@dataclass(slots=True)
class Settle(Op[RunVerdict]):
    """Replace a reservation (``held_*``) by what the call spent; 0 and 0 release it
    (``budget.settle``)."""

    name: ClassVar[str] = "run_settle"
    key: str
    held_tokens: float
    held_usd: float
    tokens: float
    usd: float
    ttl: float


@dataclass(slots=True)
class ReadRun(Op[RunState | None]):
    """The run's state, read without changing anything; None when there is no such run."""

    name: ClassVar[str] = "run_read"
    key: str
