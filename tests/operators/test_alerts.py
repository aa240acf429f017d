"""Webhook alerts against a real HTTP server: delivery, retries, bounds, and no raw secrets."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.conftest import Clock
from tests.operators.webhook_server import Receiver, webhook_receiver
from tokenfuse import Fuse, Identity, MemoryStore, VelocityPolicy
from tokenfuse.alerts import WebhookSink
from tokenfuse.config import Settings
from tokenfuse.events import listen

SECRET = "sk-live-0123456789abcdefXYZ9"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with webhook_receiver() as receiver:
        yield receiver


class Waits:
    """The sink's back-off waits, recorded instead of slept."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def __call__(self, seconds: float) -> bool:
        self.seconds.append(seconds)
        return False


def trip(fuse: Fuse, who: str | Identity) -> None:
    """Spend over the fuse's manual ceiling so the key trips once."""
    assert fuse.record(who, 2_000).tripped


def ceiling_fuse(clock: Clock, **options: object) -> Fuse:
    return Fuse(MemoryStore(clock=clock), velocity=VelocityPolicy(limit=1_000), **options)  # type: ignore[arg-type]


def test_a_trip_is_posted_as_json_without_the_credential(receiver: Receiver, clock: Clock) -> None:
    sink = WebhookSink(receiver.url)
    fuse = ceiling_fuse(clock, on_event=sink)
    identity = Identity.secret(SECRET)
    trip(fuse, identity)
    body = receiver.next()
    sink.close()
    assert body["kind"] == "tripped"
    assert body["key"] == identity.label
    assert body["reason"] == "manual_ceiling"
    assert (body["rate"], body["limit"], body["unit"]) == (2_000, 1_000, "tokens")
    assert body["text"].startswith("tokenfuse tripped: ")
    assert SECRET not in str(body) and SECRET[3:-4] not in str(body)
    assert (sink.sent, sink.failed, sink.dropped) == (1, 0, 0)


def test_failed_attempts_are_retried_with_doubling_back_off(
    receiver: Receiver, clock: Clock
) -> None:
    receiver.statuses = [503, 502, 200]
    waits = Waits()
    sink = WebhookSink(receiver.url, retries=3, backoff=0.5, wait=waits)
    trip(ceiling_fuse(clock, on_event=sink), "agent-1")
    attempts = [receiver.next() for _ in range(3)]
    sink.close()
    assert {body["key"] for body in attempts} == {"agent-1"}
    assert waits.seconds == [0.5, 1.0]
    assert (sink.sent, sink.failed) == (1, 0)


def test_a_refusing_receiver_is_not_retried_and_the_failure_is_logged(
    receiver: Receiver, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    receiver.statuses = [400]
    waits = Waits()
    sink = WebhookSink(receiver.url, wait=waits)
    trip(ceiling_fuse(clock, on_event=sink), "agent-2")
    receiver.next()
    sink.close()
    assert (sink.sent, sink.failed, waits.seconds) == (0, 1, [])
    assert "could not deliver a tripped alert for agent-2 (HTTP 400)" in caplog.text


def test_an_unreachable_receiver_gives_up_after_the_retries(free_port: int) -> None:
    waits = Waits()
    sink = WebhookSink(f"http://127.0.0.1:{free_port}/", retries=2, backoff=0.1, wait=waits)
    sink(_event("agent-3"))
    sink.close()
    assert (sink.sent, sink.failed, waits.seconds) == (0, 1, [0.1, 0.2])


def test_a_hung_receiver_never_blocks_the_caller_and_drops_are_counted(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    receiver.hold.clear()  # the receiver takes requests but does not answer
    sink = WebhookSink(receiver.url, max_queue=2)
    sink(_event("first"))
    assert receiver.next()["key"] == "first"  # in flight, hung
    for n in range(9):
        sink(_event(f"k{n}"))  # returns at once: queued (2) or dropped (7)
    assert sink.dropped == 7
    assert "webhook queue is full: 1 alert(s) dropped" in caplog.text
    receiver.hold.set()
    sink.close()
    assert sink.sent == 3
    assert [receiver.next()["key"] for _ in range(2)] == ["k0", "k1"]


def test_only_alert_kinds_are_sent(receiver: Receiver) -> None:
    sink = WebhookSink(receiver.url)
    sink(_event("a", kind="store_recovered"))
    sink(_event("b", kind="near_limit"))
    sink.close()
    assert receiver.next()["kind"] == "near_limit"
    assert receiver.count() == 0


def test_listen_reaches_every_fuse_of_the_process(receiver: Receiver, clock: Clock) -> None:
    sink = WebhookSink(receiver.url)
    stop = listen(sink)
    try:
        trip(ceiling_fuse(clock), "agent-4")  # a fuse with no hook of its own
        assert receiver.next()["key"] == "agent-4"
    finally:
        stop()
    trip(ceiling_fuse(clock), "agent-5")
    sink.close()
    assert receiver.count() == 0


def test_the_environment_installs_a_webhook_with_no_code(
    receiver: Receiver, clock: Clock, environment: Callable[[dict[str, str]], Settings]
) -> None:
    environment({"TOKENFUSE_ALERT_WEBHOOK": receiver.url})
    trip(ceiling_fuse(clock), "agent-6")
    assert receiver.next()["key"] == "agent-6"


def test_the_sink_repr_hides_the_url_path(receiver: Receiver) -> None:
    sink = WebhookSink("https://hooks.example.com/services/T000/B000/XXXXSECRET")
    assert "XXXXSECRET" not in repr(sink) and "hooks.example.com" in repr(sink)
    with pytest.raises(ValueError, match="http"):
        WebhookSink("ftp://example.com")


def _event(key: str, kind: str = "tripped") -> object:
    from tokenfuse import FuseEvent

    return FuseEvent(kind, key, f"{kind} for {key}")  # type: ignore[arg-type]
