"""Replay: try a policy on recorded usage before enforcing it.

Recorded usage (rows of timestamp, key, tokens: CSV with a header, or JSON lines) goes through
the very policy core the guards use, on a simulated clock (``Fuse(MemoryStore(clock=...))``):
each row is a call that is gated, then recorded, as ``FuseTransport`` would have done at that
moment. The result says, per key, when and why it would have tripped, and how many calls and
tokens would have been refused. Nothing sleeps: a month replays in seconds.

Columns are found by name, in any case: the time in ``timestamp``, ``time``, ``ts``, ``at``,
``date`` or ``created_at`` (epoch seconds or milliseconds, or ISO 8601; without a zone, UTC);
the key in ``key``, ``identity``, ``api_key``, ``user``, ``agent``, ``caller`` or ``key_id``;
the amount in ``tokens``, ``total_tokens``, ``amount`` or ``usage`` (inbound: one call per row,
the amount ignored). A row that cannot be read is skipped and counted, never fatal.

>>> result = replay([UsageRow(0.0, "agent-7", 90_000.0), UsageRow(1.0, "agent-7", 90_000.0)])
>>> [(trip.reason, trip.rate) for trip in result.keys[0].trips]
[('cold_start_ceiling', 180000.0)]
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from ._admin.refs import looks_like_credential
from ._core.bucket import BucketPolicy
from ._core.velocity import VelocityPolicy
from ._errors import FuseTripped
from ._fuse import Decision, Fuse
from ._identity import Identity
from ._settings import Settings
from ._stores.memory import MemoryStore

__all__ = [
    "KeyReplay",
    "ReplayResult",
    "Trip",
    "UsageRow",
    "read_usage",
    "replay",
    "replay_file",
]

KeyKind = Literal["auto", "name", "secret"]

_TIME = ("timestamp", "time", "ts", "at", "date", "created_at")
_KEY = ("key", "identity", "api_key", "user", "agent", "caller", "key_id")
_AMOUNT = ("tokens", "total_tokens", "amount", "usage")
_MAX_PROBLEMS = 20  # problems kept to show; every skipped row is counted


@dataclass(frozen=True, slots=True)
class UsageRow:
    """One recorded call: when (epoch seconds), whose, how much."""

    at: float
    key: str
    tokens: float


@dataclass(frozen=True, slots=True)
class Trip:
    """One moment the key would have been opened, with the refusal's numbers."""

    at: float
    reason: str
    rate: float
    limit: float
    baseline: float | None
    multiple: float | None
    blocked_for: float
    message: str

    @classmethod
    def of(cls, at: float, error: FuseTripped) -> Trip:
        return cls(
            at=at,
            reason=error.reason,
            rate=error.rate,
            limit=error.limit,
            baseline=error.baseline,
            multiple=error.multiple,
            blocked_for=error.retry_after,
            message=str(error),
        )


@dataclass(slots=True)
class KeyReplay:
    """What the policy would have done to one key."""

    key: str  # its label: a name as is, a credential redacted
    key_id: str
    calls: int = 0
    tokens: float = 0.0
    refused_calls: int = 0
    refused_tokens: float = 0.0
    refusals: dict[str, int] = field(default_factory=dict)  # by reason
    trips: list[Trip] = field(default_factory=list)
    first_at: float = math.inf
    last_at: float = -math.inf


@dataclass(slots=True)
class ReplayResult:
    """A replay's outcome: every key (those that tripped first), and what could not be read."""

    keys: list[KeyReplay]
    rows: int
    velocity: VelocityPolicy
    bucket: BucketPolicy | None = None
    inbound: bool = False
    skipped: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def tripped(self) -> list[KeyReplay]:
        return [key for key in self.keys if key.trips]

    def as_dict(self) -> dict[str, object]:
        """JSON-ready data (``tokenfuse replay --json``)."""
        return {
            "rows": self.rows,
            "skipped": self.skipped,
            "problems": self.problems,
            "inbound": self.inbound,
            "velocity": asdict(self.velocity),
            "bucket": None if self.bucket is None else asdict(self.bucket),
            "keys": [asdict(key) for key in self.keys],
        }


# -- reading ----------------------------------------------------------------------------------


def _moment(value: object) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    else:
        text = str(value).strip()
        try:
            number = float(text)
        except ValueError:
            if text.endswith(("Z", "z")):
                text = text[:-1] + "+00:00"
            moment = datetime.fromisoformat(text)
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=timezone.utc)
            return moment.timestamp()
    if not math.isfinite(number):
        raise ValueError(f"time {value!r} is not finite")
    return number / 1000.0 if number > 1e11 else number  # milliseconds past 1973-03-03


def _field(row: Mapping[str, object], names: tuple[str, ...]) -> object:
    for name in names:
        if name in row and row[name] not in (None, ""):
            return row[name]
    raise ValueError(f"no {names[0]} column (looked for {', '.join(names)})")


def _row(raw: Mapping[str, object], inbound: bool) -> UsageRow:
    row = {str(name).strip().lower(): value for name, value in raw.items() if name is not None}
    at = _moment(_field(row, _TIME))
    key = str(_field(row, _KEY)).strip()
    tokens = 1.0 if inbound else float(str(_field(row, _AMOUNT)))
    if not key:
        raise ValueError("empty key")
    if not (math.isfinite(tokens) and tokens >= 0):
        raise ValueError(f"tokens must be a finite, non-negative number, not {tokens!r}")
    return UsageRow(at, key, tokens)


def read_usage(
    source: str | Path | Iterable[Mapping[str, object]], *, inbound: bool = False
) -> tuple[list[UsageRow], int, list[str]]:
    """(the rows in time order, how many were skipped, the first few problems) of a CSV or
    JSON-lines file (a path), or of records already parsed."""
    if isinstance(source, (str, Path)):
        text = Path(source).read_text(encoding="utf-8-sig", errors="replace")
        records: Iterable[tuple[int, Mapping[str, object] | None]] = _numbered(text)
    else:
        records = enumerate(source, 1)
    rows: list[UsageRow] = []
    skipped = 0
    problems: list[str] = []
    for number, record in records:
        try:
            if record is None:
                raise ValueError("not a JSON object")
            rows.append(_row(record, inbound))
        except (ValueError, TypeError, OverflowError) as exc:
            skipped += 1
            if len(problems) < _MAX_PROBLEMS:
                problems.append(f"line {number}: {exc}")
    rows.sort(key=lambda row: row.at)  # stable: rows of one moment keep their order
    return rows, skipped, problems


def _numbered(text: str) -> Iterator[tuple[int, Mapping[str, object] | None]]:
    """(line number, record) of JSON lines or of CSV rows; None for a line that is no object."""
    if text.lstrip().startswith("{"):
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    record = json.loads(line)
                except ValueError:
                    record = None
                yield number, record if isinstance(record, dict) else None
        return
    reader = csv.DictReader(io.StringIO(text))
    for record in reader:
        yield reader.line_num, record


# -- replaying --------------------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _identity(key: str, kind: KeyKind) -> Identity:
    secret = kind == "secret" or (kind == "auto" and looks_like_credential(key))
    return Identity.secret(key) if secret else Identity.named(key)


def replay(
    rows: Iterable[UsageRow],
    settings: Settings | None = None,
    *,
    inbound: bool = False,
    keys: KeyKind = "auto",
) -> ReplayResult:
    """Replay ``rows`` (in time order) through the policy of ``settings`` (default: the
    process's, ``TOKENFUSE_*``): outbound (gate, then record the tokens), or ``inbound``
    (admit one call per row through the bucket and the call velocity)."""
    if settings is None:
        from ._settings import current

        settings = current()
    rows = list(rows)
    clock = _Clock()
    store = MemoryStore(clock=clock, max_keys=max(len({row.key for row in rows}), 1))
    secret = settings.secret  # the deployment's: key ids as its operators see them
    if inbound:
        velocity, bucket = settings.inbound_velocity(), settings.bucket()
        fuse = Fuse(store, name="inbound", velocity=velocity, bucket=bucket, secret=secret)
    else:
        velocity, bucket = settings.velocity(), None
        fuse = Fuse(store, velocity=velocity, secret=secret)
    replays: dict[str, KeyReplay] = {}
    identities: dict[str, Identity] = {}
    for row in rows:
        clock.now = row.at
        identity = identities.get(row.key)
        if identity is None:
            identity = identities[row.key] = _identity(row.key, keys)
        seen = replays.get(row.key)
        if seen is None:
            seen = replays[row.key] = KeyReplay(identity.label, fuse.key_id(identity))
        _count(seen, row, _decide(fuse, identity, row, inbound), inbound)
    ordered = sorted(replays.values(), key=lambda key: (not key.trips, -key.tokens))
    return ReplayResult(ordered, len(rows), velocity, bucket, inbound)


def _decide(fuse: Fuse, identity: Identity, row: UsageRow, inbound: bool) -> Decision:
    if inbound:
        return fuse.admit(identity, cost=1.0, amount=1.0)
    gate = fuse.gate(identity)
    return gate if not gate.allowed else fuse.record(identity, row.tokens)


def _count(seen: KeyReplay, row: UsageRow, decision: Decision, inbound: bool) -> None:
    seen.calls += 1
    seen.first_at = min(seen.first_at, row.at)
    seen.last_at = max(seen.last_at, row.at)
    if decision.tripped and decision.error is not None:
        seen.trips.append(Trip.of(row.at, decision.error))
    # Outbound, the call whose tokens trip the key was made (its tokens were spent); inbound,
    # admission decides before the call, so the tripping call is refused.
    if decision.allowed or (decision.tripped and not inbound):
        seen.tokens += row.tokens
        return
    reason = decision.error.reason if decision.error is not None else "refused"
    seen.refused_calls += 1
    seen.refused_tokens += row.tokens
    seen.refusals[reason] = seen.refusals.get(reason, 0) + 1


def replay_file(
    path: str | Path,
    settings: Settings | None = None,
    *,
    inbound: bool = False,
    keys: KeyKind = "auto",
) -> ReplayResult:
    """``replay`` of a CSV or JSON-lines file, with what could not be read counted."""
    rows, skipped, problems = read_usage(path, inbound=inbound)
    result = replay(rows, settings, inbound=inbound, keys=keys)
    result.skipped, result.problems = skipped, problems
    return result
