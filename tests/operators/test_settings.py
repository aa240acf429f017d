"""Configuration without code: the environment and ``configure`` reach the zero-argument guards."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import tokenfuse
from tokenfuse import ConfigurationError, FuseTransport, RedisStore
from tokenfuse.config import VARIABLES, Settings, current

ROOT = Path(__file__).resolve().parents[2]

Environment = Callable[[dict[str, str]], Settings]

# A value for each variable that differs from its default, and the setting it must produce.
SAMPLES = {
    "TOKENFUSE_REDIS_URL": ("redis://:hunter2@cache:6379/2", "redis://:hunter2@cache:6379/2"),
    "TOKENFUSE_REDIS_PREFIX": ("team-a", "team-a"),
    "TOKENFUSE_SECRET": ("s3cr3t-value", "s3cr3t-value"),
    "TOKENFUSE_FAIL_CLOSED": ("yes", True),
    "TOKENFUSE_SHADOW": ("1", True),
    "TOKENFUSE_LIMIT": ("50k/min", 50_000.0),
    "TOKENFUSE_COLD_START_LIMIT": ("off", None),
    "TOKENFUSE_SPIKE_MULTIPLE": ("6", 6.0),
    "TOKENFUSE_MIN_BASELINE": ("1M/hour", 1e6 / 60),
    "TOKENFUSE_LEARNING_PERIOD": ("1d", 86_400.0),
    "TOKENFUSE_COOLDOWN": ("2m", 120.0),
    "TOKENFUSE_INBOUND_LIMIT": ("600/hour", 10.0),
    "TOKENFUSE_BUCKET_RATE": ("1.2k/min", 20.0),
    "TOKENFUSE_BUCKET_CAPACITY": ("80", 80.0),
    # (a plain number is per minute for limits, per second for the bucket rate)
    "TOKENFUSE_ALERT_WEBHOOK": ("https://hooks.example/x", "https://hooks.example/x"),
    "TOKENFUSE_METRICS": ("off", False),
    "TOKENFUSE_METRICS_KEYS": ("3f9a0c1b2d4e, agent-42", ("3f9a0c1b2d4e", "agent-42")),
    "TOKENFUSE_METRICS_TOP": ("25", 25),
    "TOKENFUSE_ADMIN_TOKEN": (" an-admin-token-0123 ", "an-admin-token-0123"),
}


def test_plain_numbers_are_rates_in_the_documented_unit() -> None:
    settings = Settings.from_env({"TOKENFUSE_LIMIT": "20000", "TOKENFUSE_BUCKET_RATE": "2.5"})
    assert (settings.limit, settings.bucket_rate) == (20_000.0, 2.5)


def test_every_variable_has_a_sample_here() -> None:
    assert {variable.env for variable in VARIABLES} == set(SAMPLES)


@pytest.mark.parametrize("variable", VARIABLES, ids=lambda variable: variable.env)
def test_each_variable_sets_its_setting(variable: object) -> None:
    env = variable.env  # type: ignore[attr-defined]
    text, expected = SAMPLES[env]
    settings = Settings.from_env({env: text})
    value = getattr(settings, variable.setting)  # type: ignore[attr-defined]
    assert value == pytest.approx(expected) if isinstance(expected, float) else value == expected
    assert value != getattr(Settings(), variable.setting)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("env", "text"),
    [
        ("TOKENFUSE_LIMIT", "lots"),
        ("TOKENFUSE_SHADOW", "maybe"),
        ("TOKENFUSE_COOLDOWN", "soon"),
        ("TOKENFUSE_BUCKET_CAPACITY", "-3"),
        ("TOKENFUSE_METRICS_TOP", "2.5"),
    ],
)
def test_a_bad_value_is_refused_naming_its_variable(env: str, text: str) -> None:
    with pytest.raises(ConfigurationError, match=env):
        Settings.from_env({env: text})


def test_every_variable_is_documented() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text()
    documented = set(re.findall(r"`(TOKENFUSE_[A-Z_]+)`", doc))
    assert {variable.env for variable in VARIABLES} <= documented


def test_the_repr_shows_neither_the_secret_nor_a_password() -> None:
    settings = Settings.from_env(
        {"TOKENFUSE_SECRET": "s3cr3t-value", "TOKENFUSE_REDIS_URL": "redis://u:hunter2@h:1/0"}
    )
    shown = repr(settings)
    assert "s3cr3t" not in shown and "hunter2" not in shown
    assert "redis://u:***@h:1/0" in shown
    token = Settings.from_env({"TOKENFUSE_ADMIN_TOKEN": "admin-token-0123456789"})
    assert "0123456789" not in repr(token)
    assert token.describe()["admin_token"] == "(set)"


def test_configure_wins_over_the_environment_and_checks_like_it(environment: Environment) -> None:
    environment({"TOKENFUSE_LIMIT": "10k/min", "TOKENFUSE_COOLDOWN": "5m"})
    settings = tokenfuse.configure(limit="1M/hour", bucket_capacity=7)
    assert settings.limit == pytest.approx(1e6 / 60)
    assert settings.cooldown == 300.0  # still the environment's
    assert current() is settings
    with pytest.raises(ConfigurationError, match="unknown setting"):
        tokenfuse.configure(limt=5)
    with pytest.raises(ConfigurationError, match="bucket_rate"):
        tokenfuse.configure(bucket_rate="fast")
    assert current() is settings  # a refused change changes nothing


def test_zero_argument_guards_use_the_settings(environment: Environment) -> None:
    environment({"TOKENFUSE_LIMIT": "50k/min", "TOKENFUSE_BUCKET_CAPACITY": "3"})
    transport = FuseTransport()
    inbound = tokenfuse.default_inbound_fuse()
    assert transport.fuse.velocity is not None
    assert transport.fuse.velocity.limit == 50_000.0
    assert inbound.bucket is not None and inbound.bucket.capacity == 3.0
    assert inbound.store is transport.fuse.store  # one store for both sides
    tokenfuse.configure(limit="5k/min")
    assert FuseTransport().fuse.velocity.limit == 5_000.0  # type: ignore[union-attr]
    assert transport.fuse.velocity.limit == 50_000.0  # built before: keeps its fuse


def test_zero_argument_middleware_enforces_the_configured_bucket(environment: Environment) -> None:
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    environment({"TOKENFUSE_BUCKET_CAPACITY": "3", "TOKENFUSE_BUCKET_RATE": "1/hour"})

    async def tool(request: object) -> JSONResponse:
        return JSONResponse({"ok": True})

    app = Starlette(routes=[Route("/tool", tool, methods=["POST"])])
    app.add_middleware(tokenfuse.TokenFuse)
    with TestClient(app) as client:
        codes = [client.post("/tool", headers={"x-api-key": "k-1"}).status_code for _ in range(5)]
    assert codes == [200, 200, 200, 429, 429]


def test_shadow_from_the_environment_never_refuses(environment: Environment) -> None:
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    quota = {"TOKENFUSE_BUCKET_CAPACITY": "1", "TOKENFUSE_BUCKET_RATE": "1/hour"}
    environment({**quota, "TOKENFUSE_SHADOW": "1"})

    async def tool(request: object) -> JSONResponse:
        return JSONResponse({"ok": True})

    app = Starlette(routes=[Route("/tool", tool, methods=["POST"])])
    app.add_middleware(tokenfuse.TokenFuse)
    with TestClient(app) as client:
        replies = [client.post("/tool", headers={"x-api-key": "k-2"}) for _ in range(3)]
    assert [reply.status_code for reply in replies] == [200, 200, 200]
    assert ";r=0;" in replies[-1].headers["ratelimit"]  # decided: over its quota


@pytest.mark.redis
def test_processes_sharing_the_environment_share_one_redis(
    redis_url: str, redis_prefix: str
) -> None:
    """Two processes with nothing but the environment in common count into the same key."""
    env = {"TOKENFUSE_REDIS_URL": redis_url, "TOKENFUSE_REDIS_PREFIX": redis_prefix}
    script = "import tokenfuse\nprint(tokenfuse.default_fuse().record('agent-7', 4000).rate)\n"
    rates = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", script],
            env={**_clean_environ(), **env},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        rates.append(float(done.stdout))
    assert rates == [4000.0, 8000.0]
    store = RedisStore.from_url(redis_url, prefix=redis_prefix)
    try:
        assert tokenfuse.Fuse(store).status("agent-7").rate == 8000.0
    finally:
        store.close()


def _clean_environ() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("TOKENFUSE_")}
