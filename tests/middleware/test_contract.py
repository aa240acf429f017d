"""What every guarded app promises, on FastAPI, Starlette and Flask through their test clients.

Time is the simulated ``clock`` of the store: nothing here sleeps.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from tests.conftest import Clock
from tests.middleware.apps import STREAM_CHUNKS, Call
from tokenfuse import BucketPolicy, Fuse, FuseEvent, Identity, VelocityPolicy

TOKEN = "sk-test-contract-0001"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
POLICY = '"default";q=50;w=5'  # FREE: a burst of 50, refilled from empty in 5 s


def burst(call: Call, n: int, path: str = "/tools/refund", headers: dict[str, str] = AUTH) -> None:
    for _ in range(n):
        assert call("POST", path, headers).status == 200


def test_allowed_calls_carry_the_ratelimit_headers(
    serve: Callable[..., Call], make_fuse: Callable[..., Fuse]
) -> None:
    call = serve(fuse=make_fuse())

    first = call("POST", "/tools/refund", AUTH)

    assert first.status == 200
    assert first.json() == {"refund": "ok"}
    assert first.headers["ratelimit-policy"] == POLICY
    assert first.headers["ratelimit"] == '"default";r=49;t=1'
    assert "retry-after" not in first.headers
    burst(call, 11)
    twelfth = call("POST", "/tools/crm", AUTH)
    assert twelfth.headers["ratelimit"] == '"default";r=37;t=2'  # 13 spent, 1.3 s to refill


def test_a_burst_over_capacity_is_refused_with_the_exact_body_and_headers(
    serve: Callable[..., Call], make_fuse: Callable[..., Fuse]
) -> None:
    fuse = make_fuse()
    call = serve(fuse=fuse)
    burst(call, 50)
    key_id = fuse.key_id(Identity.secret(TOKEN))

    refused = call("POST", "/tools/refund", AUTH)

    assert refused.status == 429
    assert refused.json() == {
        "type": "quota_exhausted",
        "message": (
            f"call quota exhausted for key sk-…0001 [id {key_id}]: the bucket of 50 calls "
            "refills at 10/s (retry in 0.10 s)"
        ),
        "key": "sk-…0001",
        "key_id": key_id,
        "unit": "calls",
        "rate": 10.0,
        "limit": 50.0,
        "baseline": None,
        "multiple": None,
        "retry_after": 0.1,
    }
    assert refused.headers["content-type"] == "application/json"
    assert refused.headers["retry-after"] == "1"
    assert refused.headers["ratelimit-policy"] == POLICY
    assert refused.headers["ratelimit"] == '"default";r=0;t=1'
    other = call("POST", "/tools/refund", {"Authorization": "Bearer sk-someone-else-0002"})
    assert other.status == 200  # one caller's burst is contained to that caller


def test_refill_lets_calls_through_again_after_retry_after(
    serve: Callable[..., Call], make_fuse: Callable[..., Fuse], clock: Clock
) -> None:
    call = serve(fuse=make_fuse())
    burst(call, 50)
    refused = call("POST", "/tools/refund", AUTH)
    assert refused.status == 429

    clock.advance(refused.json()["retry_after"])
    again = call("POST", "/tools/refund", AUTH)
    assert again.status == 200
    assert again.headers["ratelimit"] == '"default";r=0;t=5'
    assert call("POST", "/tools/refund", AUTH).status == 429  # one token came back, not two

    clock.advance(5.0)
    burst(call, 50)  # full again


def test_a_live_ceiling_trips_the_velocity_check_on_a_tool_endpoint(
    serve: Callable[..., Call], make_fuse: Callable[..., Fuse], clock: Clock
) -> None:
    fuse = make_fuse(bucket=BucketPolicy(rate=100, capacity=1000))
    call = serve(fuse=fuse)
    fuse.set_limit(Identity.secret(TOKEN), "20/minute")  # live, e.g. from an admin console
    burst(call, 20)
    key_id = fuse.key_id(Identity.secret(TOKEN))

    tripped = call("POST", "/tools/refund", AUTH)

    assert tripped.status == 429
    assert tripped.json() == {
        "type": "manual_ceiling",
        "message": (
            "rate over the ceiling: 21 calls/min is above 20 calls/min for key "
            f"sk-…0001 [id {key_id}] (blocked for 60 s)"
        ),
        "key": "sk-…0001",
        "key_id": key_id,
        "unit": "calls",
        "rate": 21.0,
        "limit": 20.0,
        "baseline": None,
        "multiple": None,
        "retry_after": 60.0,
    }
    assert tripped.headers["retry-after"] == "60"
    assert tripped.headers["ratelimit"] == '"default";r=0;t=60'
    clock.advance(30.0)
    latched = call("POST", "/tools/crm", AUTH)  # the latch covers every route of the caller
    assert latched.status == 429
    assert latched.json()["retry_after"] == 30.0
    assert latched.headers["ratelimit"] == '"default";r=0;t=30'
    clock.advance(35.0)
    assert call("POST", "/tools/refund", AUTH).status == 200


def test_a_looping_agent_trips_as_loop_suspected_over_its_own_baseline(
    serve: Callable[..., Call], make_fuse: Callable[..., Fuse], clock: Clock
) -> None:
    velocity = VelocityPolicy(
        unit="calls", learning_period=600, min_samples=10, min_baseline=5, cold_start_limit=None
    )
    call = serve(fuse=make_fuse(bucket=BucketPolicy(rate=100, capacity=1000), velocity=velocity))
    for _ in range(13 * 10):  # 13 minutes of a steady 10 calls a minute
        assert call("POST", "/tools/refund", AUTH).status == 200
        clock.advance(6.0)

    statuses = []
    for _ in range(150):  # then the agent loops: far above 10x its normal, in seconds
        reply = call("POST", "/tools/refund", AUTH)
        statuses.append(reply.status)
        if reply.status == 429:
            break
        clock.advance(0.1)

    assert statuses[-1] == 429, "the loop was never caught"
    body = reply.json()
    assert body["type"] == "loop_suspected"
    assert body["message"].startswith("possible agent loop or retry storm: ")
    assert body["baseline"] == pytest.approx(10.0)
    assert body["multiple"] >= 10
    assert body["rate"] >= 10 * body["baseline"]
    assert len(statuses) < 110  # tripped within the first minute of the loop


def test_shadow_mode_decides_and_reports_but_never_refuses(
    serve: Callable[..., Call],
    make_fuse: Callable[..., Fuse],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("tokenfuse._throttle.monotonic", lambda: 1000.0)  # log throttle
    fuse = make_fuse()
    call = serve(fuse=fuse, shadow=True)
    burst(call, 50)

    with caplog.at_level(logging.WARNING, logger="tokenfuse.middleware"):
        over = call("POST", "/tools/refund", AUTH)
        for _ in range(20):  # a looping agent in shadow mode: one log line, not twenty
            assert call("POST", "/tools/refund", AUTH).status == 200

    assert over.status == 200
    assert over.json() == {"refund": "ok"}
    assert over.headers["ratelimit"] == '"default";r=0;t=1'  # what enforcement would say
    assert "retry-after" not in over.headers
    [record] = [r for r in caplog.records if "shadow mode" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "quota_exhausted" in record.getMessage()
    assert f"sk-…0001 [id {fuse.key_id(Identity.secret(TOKEN))}]" in record.getMessage()


def test_excluded_routes_are_neither_counted_nor_refused(
    serve: Callable[..., Call], make_fuse: Callable[..., Fuse]
) -> None:
    call = serve(fuse=make_fuse(), exclude=["/health"])

    for _ in range(80):
        health = call("GET", "/health")
        assert health.status == 200
        assert "ratelimit" not in health.headers

    guarded = call("POST", "/tools/refund")  # anonymous callers share one guarded identity
    assert guarded.headers["ratelimit"] == '"default";r=49;t=1'


def test_streamed_responses_pass_through_intact(
    serve: Callable[..., Call], make_fuse: Callable[..., Fuse]
) -> None:
    call = serve(fuse=make_fuse())

    streamed = call("GET", "/stream", AUTH)

    assert streamed.status == 200
    assert streamed.body == b"".join(STREAM_CHUNKS)
    assert streamed.headers["content-type"].startswith("text/plain")
    assert streamed.headers["ratelimit"] == '"default";r=49;t=1'


def test_a_custom_refusal_keeps_the_standard_headers(
    serve: Callable[..., Call], make_fuse: Callable[..., Fuse]
) -> None:
    from tokenfuse._middleware import Reply

    def refusal(error: object, request: object) -> Reply:
        return Reply.json({"error": getattr(error, "reason", "?")}, status=429)

    call = serve(fuse=make_fuse(), refusal=refusal)
    burst(call, 50)

    refused = call("POST", "/tools/refund", AUTH)

    assert refused.status == 429
    assert refused.json() == {"error": "quota_exhausted"}
    assert refused.headers["retry-after"] == "1"
    assert refused.headers["ratelimit"] == '"default";r=0;t=1'


def test_route_costs_take_more_from_the_bucket(
    serve: Callable[..., Call], make_fuse: Callable[..., Fuse]
) -> None:
    call = serve(fuse=make_fuse(), cost={"/tools/refund": 5})

    assert call("POST", "/tools/refund", AUTH).headers["ratelimit"] == '"default";r=45;t=1'
    assert call("POST", "/tools/crm", AUTH).headers["ratelimit"] == '"default";r=44;t=1'


def test_tiers_from_code_and_live_overrides_from_the_store(
    serve: Callable[..., Call], make_fuse: Callable[..., Fuse]
) -> None:
    from tokenfuse import GROWTH, STARTER

    fuse = make_fuse()
    call = serve(
        fuse=fuse,
        tiers=lambda request, identity: STARTER if request.header("x-plan") == "starter" else None,
    )
    assert call("POST", "/tools/crm", AUTH).headers["ratelimit-policy"] == POLICY
    starter = call("POST", "/tools/crm", {**AUTH, "x-plan": "starter"})
    assert starter.headers["ratelimit-policy"] == '"default";q=200;w=4'
    # Same caller, same bucket: a new tier refills faster and holds more, it does not refill.
    assert starter.headers["ratelimit"] == '"default";r=48;t=4'

    growth = serve(fuse=fuse, tiers={"sk-growth-0003": GROWTH})
    assert (
        growth("POST", "/tools/crm", {"X-API-Key": "sk-growth-0003"}).headers["ratelimit-policy"]
        == '"default";q=500;w=5'
    )
    fuse.set_bucket(Identity.secret("sk-growth-0003"), capacity=7, rate=1)  # live: wins
    live = growth("POST", "/tools/crm", {"X-API-Key": "sk-growth-0003"})
    assert live.headers["ratelimit-policy"] == '"default";q=7;w=7'


def test_near_limit_alert_fires_once_per_episode_to_hooks_and_log(
    serve: Callable[..., Call],
    make_fuse: Callable[..., Fuse],
    clock: Clock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    events: list[FuseEvent] = []
    fuse = make_fuse(bucket=BucketPolicy(rate="6/minute", capacity=5), on_event=events.append)
    call = serve(fuse=fuse)

    def hot(minutes: int) -> None:  # 6 calls a minute: 100% of the refill, for minutes on end
        for _ in range(minutes * 6):
            assert call("POST", "/tools/refund", AUTH).status == 200
            clock.advance(10.0)

    with caplog.at_level(logging.WARNING, logger="tokenfuse"):
        hot(8)
        assert [e.kind for e in events] == ["near_limit"]
        clock.advance(180.0)  # quiet: the episode ends and the alert re-arms
        hot(8)

    assert [e.kind for e in events] == ["near_limit", "near_limit"]
    key_id = fuse.key_id(Identity.secret(TOKEN))
    assert (events[0].key, events[0].key_id) == ("sk-…0001", key_id)
    near = [r.getMessage() for r in caplog.records if r.getMessage().startswith("near_limit")]
    assert len(near) == 2
    assert f"key sk-…0001 [id {key_id}] has used over" in near[0]


def test_a_fuse_without_bucket_sends_retry_after_but_no_quota_headers(
    serve: Callable[..., Call], make_fuse: Callable[..., Fuse]
) -> None:
    velocity = VelocityPolicy(unit="calls", limit=3, cold_start_limit=None)
    call = serve(fuse=make_fuse(bucket=None, velocity=velocity))
    burst(call, 3)

    refused = call("POST", "/tools/refund", AUTH)

    assert refused.status == 429
    assert refused.json()["type"] == "manual_ceiling"
    assert refused.headers["retry-after"] == "60"
    assert "ratelimit" not in refused.headers  # no quota to advertise
    assert "ratelimit-policy" not in refused.headers
