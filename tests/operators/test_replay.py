"""Replay recorded usage files through a policy on a simulated clock."""

from __future__ import annotations

import csv
import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tokenfuse import Fuse
from tokenfuse.config import Settings
from tokenfuse.fuse import Identity
from tokenfuse.replay import UsageRow, read_usage, replay, replay_file

START = 1_767_225_600.0  # 2026-01-01T00:00:00Z
SECRET = "sk-proj-live-0123456789abcdefQRST"


def a_month(loop_day: float = 20.0) -> list[UsageRow]:
    """Two keys, a call every 5 minutes for 30 days; from ``loop_day`` on, one of them loops
    (a call of a growing size every 3 s) for 10 minutes."""
    rows = []
    for step in range(30 * 24 * 12):
        at = START + step * 300
        rows.append(UsageRow(at, "agent-steady", 2_000))
        rows.append(UsageRow(at + 7, SECRET, 1_500))
    loop = START + loop_day * 86_400 + 13
    rows += [UsageRow(loop + 3 * n, SECRET, 1_500 + 200 * n) for n in range(200)]
    return sorted(rows, key=lambda row: row.at)


def write_csv(path: Path, rows: list[UsageRow], time_column: str = "timestamp") -> Path:
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow([time_column, "key", "tokens"])
        for row in rows:
            stamp = datetime.fromtimestamp(row.at, timezone.utc).isoformat().replace("+00:00", "Z")
            writer.writerow([stamp, row.key, row.tokens])
    return path


def test_a_month_replayed_finds_the_loop_when_it_started(tmp_path: Path) -> None:
    settings = Settings().updated(secret="the deployment's secret, 32 chars+")
    result = replay_file(write_csv(tmp_path / "usage.csv", a_month()), settings)
    assert result.rows == 2 * 30 * 24 * 12 + 200 and result.skipped == 0
    looping, steady = result.keys
    assert (steady.key, steady.trips) == ("agent-steady", [])
    deployment = Fuse(secret="the deployment's secret, 32 chars+")
    assert (looping.key, looping.key_id) == ("sk-…QRST", deployment.key_id(Identity.secret(SECRET)))
    first = looping.trips[0]
    loop_start = START + 20 * 86_400 + 13
    assert first.reason == "loop_suspected"
    assert loop_start < first.at < loop_start + 60  # within a minute of the loop's start
    assert first.multiple is not None and first.multiple >= 10
    assert looping.refused_calls > 100  # the rest of the loop would have been refused
    assert looping.refused_tokens > 0 and SECRET not in json.dumps(result.as_dict())


def test_a_stricter_policy_trips_earlier_and_on_more(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "usage.csv", a_month())
    strict = replay_file(path, Settings().updated(limit="1.5k/min"))
    assert {key.key for key in strict.tripped} == {"agent-steady", "sk-…QRST"}
    assert strict.tripped[0].trips[0].reason == "manual_ceiling"


def test_jsonl_with_epoch_milliseconds_and_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "usage.jsonl"
    lines = [
        json.dumps({"ts": START * 1000, "user": "agent-1", "total_tokens": 110_000}),
        "not json",
        json.dumps({"ts": START * 1000 + 1000, "user": "agent-1", "total_tokens": 110_000}),
        json.dumps({"ts": "yesterday", "user": "agent-1", "total_tokens": 5}),
        json.dumps({"ts": START * 1000 + 2000, "user": "agent-1", "total_tokens": -4}),
        json.dumps({"ts": START * 1000 + 3000, "total_tokens": 5}),
    ]
    path.write_text("\n".join(lines) + "\n")
    result = replay_file(path, Settings())
    assert result.rows == 2 and result.skipped == 4
    assert result.problems[0] == "line 2: not a JSON object"
    assert "no key column" in result.problems[-1]
    (trip,) = result.keys[0].trips
    # over 100,000/min without its largest call
    assert (trip.reason, trip.at, trip.rate) == ("cold_start_ceiling", START + 1, 220_000.0)


def test_inbound_rows_are_calls_through_the_bucket(tmp_path: Path) -> None:
    rows = [UsageRow(START + n * 0.01, "caller-1", 0) for n in range(80)]
    result = replay(rows, Settings().updated(bucket_capacity=50, bucket_rate=10), inbound=True)
    (caller,) = result.keys
    assert (caller.calls, caller.refused_calls) == (80, 23)  # 50, and 7 refilled in 0.79 s
    assert caller.refusals == {"quota_exhausted": 23} and caller.trips == []


def test_key_columns_can_be_said_to_hold_credentials_or_names(tmp_path: Path) -> None:
    rows = [UsageRow(START, "agent-1", 1)]
    assert replay(rows, keys="secret").keys[0].key == Identity.secret("agent-1").label
    assert replay([UsageRow(START, SECRET, 1)], keys="name").keys[0].key == SECRET
    assert replay([UsageRow(START, SECRET, 1)]).keys[0].key == "sk-…QRST"  # auto


def test_read_usage_sorts_by_time(tmp_path: Path) -> None:
    path = tmp_path / "u.csv"
    path.write_text("at,key,tokens\n20,a,1\n10,b,2\n")
    rows, skipped, _ = read_usage(path)
    assert [row.key for row in rows] == ["b", "a"] and skipped == 0


@pytest.mark.parametrize("column", ["timestamp", "created_at", "Time"])
def test_time_columns_by_any_of_their_names(tmp_path: Path, column: str) -> None:
    path = write_csv(tmp_path / "u.csv", [UsageRow(START, "a", 1)], time_column=column)
    assert replay_file(path).keys[0].first_at == START
