"""The ``tokenfuse`` command against a real Redis: as a subprocess (``python -m tokenfuse``, the
way an operator runs it) and in-process (``main``, for the cases that need no new process)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tokenfuse import FREE, Fuse, RedisStore, VelocityPolicy
from tokenfuse._cli import main
from tokenfuse.config import Settings
from tokenfuse.fuse import Identity

SECRET = "sk-live-0123456789abcdefCLI9"
DEPLOYMENT_SECRET = "the deployment's secret, 32 chars+"
ROOT = Path(__file__).resolve().parents[2]
SECRET_ID = Fuse(secret=DEPLOYMENT_SECRET).key_id(Identity.secret(SECRET))

pytestmark = pytest.mark.redis


@pytest.fixture
def deployment(redis_url: str, redis_prefix: str) -> Iterator[dict[str, str]]:
    """A deployment's environment, and some traffic in its Redis: seven agents, one tripped
    credential, two inbound callers."""
    env = {
        "TOKENFUSE_REDIS_URL": redis_url,
        "TOKENFUSE_REDIS_PREFIX": redis_prefix,
        "TOKENFUSE_LIMIT": "10k/min",
        "TOKENFUSE_SECRET": DEPLOYMENT_SECRET,
    }
    store = RedisStore.from_url(redis_url, prefix=redis_prefix)
    outbound = Fuse(store, velocity=VelocityPolicy(limit=10_000), secret=DEPLOYMENT_SECRET)
    inbound = Fuse(store, name="inbound", bucket=FREE, secret=DEPLOYMENT_SECRET)
    for n in range(1, 8):
        outbound.record(f"agent-{n}", 1_200.0 * n)  # agent-7: 8,400 of 10,000, near
    outbound.record(Identity.secret(SECRET), 12_000)
    for _ in range(30):
        inbound.admit("caller-1")
    yield env
    store.close()


def tokenfuse(env: dict[str, str], *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """``python -m tokenfuse ARGS`` in a process with nothing but ``env`` configured."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TOKENFUSE_")}
    return subprocess.run(
        [sys.executable, "-m", "tokenfuse", *args],
        env={**clean, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "150", **env},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


Environment = Callable[[dict[str, str]], Settings]


def run_here(
    environment: Environment,
    env: dict[str, str],
    *args: str,
    stdin: str = "",
) -> tuple[int, str, str]:
    environment(env)
    out, err = io.StringIO(), io.StringIO()
    status = main(list(args), out=out, err=err, stdin=io.StringIO(stdin))
    return status, out.getvalue(), err.getvalue()


def test_status_lists_every_key_with_its_state(deployment: dict[str, str]) -> None:
    done = tokenfuse(deployment, "status")
    assert done.returncode == 0, done.stderr
    assert "9 keys: 1 open, 1 near, 7 ok, 0 idle" in done.stdout
    assert SECRET_ID in done.stdout
    assert SECRET not in done.stdout


def test_top_once_sorts_and_json_is_data(deployment: dict[str, str]) -> None:
    done = tokenfuse(deployment, "top", "--once", "--limit", "3")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("tokenfuse top") and "9 keys (1 open, 1 near, 7 ok)" in lines[0]
    as_data = json.loads(tokenfuse(deployment, "--json", "top", "--sort", "rate").stdout)
    assert [key["rate"] for key in as_data[:3]] == [12_000.0, 8_400.0, 7_200.0]
    assert as_data[0]["state"] == "open" and as_data[0]["threshold"] == 10_000.0
    assert [key["fuse"] for key in as_data].count("inbound") == 1


def test_blocked_then_reset_by_key_id(deployment: dict[str, str]) -> None:
    key_id = SECRET_ID
    blocked = json.loads(tokenfuse(deployment, "--json", "blocked").stdout)
    assert [key["key_id"] for key in blocked] == [key_id]
    done = tokenfuse(deployment, "reset", key_id)
    assert done.returncode == 0, done.stderr
    assert "reset (1 fuse)" in done.stdout
    assert json.loads(tokenfuse(deployment, "--json", "blocked").stdout) == []


def test_a_credential_is_passed_with_secret_and_read_from_stdin(deployment: dict[str, str]) -> None:
    refused = tokenfuse(deployment, "status", SECRET)
    assert refused.returncode == 1
    assert "looks like a credential: pass it with --secret" in refused.stderr
    assert SECRET not in refused.stderr
    done = tokenfuse(
        deployment, "--json", "set-limit", "--secret", "-", "30k/min", stdin=SECRET + "\n"
    )
    assert done.returncode == 0, done.stderr
    (view,) = json.loads(done.stdout)
    assert (view["label"], view["limit"]) == ("sk-…CLI9", 30_000.0)


def test_live_changes_in_process(deployment: dict[str, str], environment: Environment) -> None:
    status, out, err = run_here(
        environment, deployment, "--json", "set-limit", "agent-3", "50k/min"
    )
    assert status == 0, err
    assert json.loads(out)[0]["limit"] == 50_000.0
    status, out, err = run_here(
        environment,
        deployment,
        "--json",
        "set-bucket",
        "caller-1",
        "--capacity",
        "5",
        "--rate",
        "1/s",
    )
    assert status == 0, err
    (view,) = json.loads(out)
    assert (view["fuse"], view["bucket_capacity"], view["bucket_rate"]) == ("inbound", 5.0, 1.0)
    status, out, err = run_here(environment, deployment, "set-bucket", "caller-1")
    assert (status, err) == (
        2,
        "tokenfuse set-bucket: set-bucket: give --rate, --capacity or both\n",
    )
    status, out, err = run_here(environment, deployment, "set-limit", "agent-3", "lots")
    assert status == 2 and "cannot read 'lots' as a rate" in err
    status, out, err = run_here(environment, deployment, "status", "agent-99")
    assert status == 1 and "no key of the fuses default, inbound matches 'agent-99'" in err
    status, out, err = run_here(environment, deployment, "--json", "events")
    events = [json.loads(line) for line in out.splitlines()]
    # The store's log: the trip of the deployment's own fuse too, not only this process's.
    assert [event["kind"] for event in events] == ["tripped", "configured", "configured"]
    assert "this process only" not in err


def test_status_of_one_key_in_detail(deployment: dict[str, str]) -> None:
    done = tokenfuse(deployment, "status", "agent-7")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "agent-7" in text and "state           near" in text
    assert (
        "8.4k tokens/min over the last 60 s" in text
        and "10.0k tokens/min (what trips it now)" in text
    )


def test_no_store_is_an_error_that_says_what_to_do(
    environment: Environment,
) -> None:
    status, _, err = run_here(environment, {}, "status")
    assert status == 2 and "pass --redis URL or set TOKENFUSE_REDIS_URL" in err


def test_redis_flag_wins_over_the_environment(deployment: dict[str, str], redis_url: str) -> None:
    env = {**deployment, "TOKENFUSE_REDIS_URL": "redis://127.0.0.1:1/0"}
    done = tokenfuse(env, "--redis", redis_url, "--json", "blocked")
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)) == 1


def test_demo_runs_with_no_redis_and_no_network() -> None:
    done = tokenfuse({}, "demo", "--pace", "0")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "LoopSuspected: possible agent loop" in text
    assert "[tokenfuse log, WARNING] tripped:" in text
    assert text.rstrip().endswith("the next call is allowed")


def test_replay_prints_when_and_why(tmp_path: Path) -> None:
    usage = tmp_path / "usage.csv"
    usage.write_text(
        "timestamp,key,tokens\n" + "".join(f"{1767225600 + n},agent-9,60000\n" for n in range(4))
    )
    done = tokenfuse({}, "replay", str(usage), "--policy", "limit=100k/min")
    assert done.returncode == 0, done.stderr
    assert "4 rows, 1 keys" in done.stdout and "1 keys would have tripped" in done.stdout
    assert "2026-01-01 00:00:01  manual_ceiling: 120.0k/min over 100.0k" in done.stdout
    data = json.loads(
        tokenfuse({}, "--json", "replay", str(usage), "--policy", "limit=1M/hour").stdout
    )
    assert data["velocity"]["limit"] == pytest.approx(16_666.67, rel=1e-4)
    assert data["keys"][0]["trips"][0]["at"] == 1767225600


def test_forgive_says_what_is_missing(deployment: dict[str, str]) -> None:
    if hasattr(Fuse, "forgive"):
        pytest.skip("this tokenfuse has Fuse.forgive")
    forgive = tokenfuse(deployment, "forgive", "agent-1")
    assert forgive.returncode == 1 and "not available" in forgive.stderr


def test_without_rich_human_output_asks_for_the_extra(
    deployment: dict[str, str],
    environment: Environment,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "rich.console", None)  # as if rich were not installed
    status, _, err = run_here(environment, deployment, "blocked")
    assert status == 2 and "pip install 'tokenfuse[cli]'" in err
    status, out, _ = run_here(environment, deployment, "--json", "blocked")
    assert status == 0 and json.loads(out)[0]["state"] == "open"


def test_the_console_script_points_at_main() -> None:
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, name = scripts["tokenfuse"].partition(":")
    assert getattr(__import__(module, fromlist=[name]), name) is main
