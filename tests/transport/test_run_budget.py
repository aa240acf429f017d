"""Run budgets on outbound calls: the real openai 3.x and anthropic 2.x SDKs over
``FuseTransport`` with a mock inner transport, on the embedded store and a simulated clock.

Each call reserves its estimate before it is sent and settles with its real usage after; a
call the run cannot afford raises ``BudgetExceeded`` before a byte leaves, and user code
catches it as such with either SDK.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from typing import Any

import anthropic
import httpx2
import openai
import pytest

import tokenfuse
from tests.conftest import Clock
from tokenfuse import ConfigurationError, Fuse, Identity, MemoryStore, StoreUnavailable
from tokenfuse._transport import AsyncFuseTransport, FuseTransport
from tokenfuse.events import FuseEvent
from tokenfuse.guards import RUN_HEADER, BudgetExceeded, Price, current_runs, run, set_prices

from .test_sdks import (
    ANTHROPIC_KEY,
    MESSAGES,
    OPENAI_KEY,
    LLMStub,
    anthropic_client,
    ask_anthropic,
    ask_openai,
    openai_client,
)

OPENAI_CALL = 25  # tokens each openai-chat reply reports (tests/transport/bodies.py)
ANTHROPIC_CALL = 200  # anthropic-messages
ANTHROPIC_STREAM = 40  # anthropic-stream


@pytest.fixture
def events(fuse: Fuse) -> list[FuseEvent]:
    seen: list[FuseEvent] = []
    fuse.on_event(seen.append)
    return seen


def test_openai_calls_spend_the_run_until_it_refuses(fuse: Fuse, events: list[FuseEvent]) -> None:
    stub = LLMStub()
    client = openai_client(fuse, stub)
    answered = 0
    caught: BudgetExceeded | None = None
    with run("run-openai", tokens=1_000, fuse=fuse, call_estimate=100) as budget:
        try:
            while answered < 1_000:
                ask_openai(client)
                answered += 1
        except BudgetExceeded as exc:  # what agent code writes
            caught = exc
    assert caught is not None
    error = caught
    assert type(error) is BudgetExceeded  # openai passes it through as it is
    assert len(stub.requests) == answered  # the refused call never left the process
    assert error.run_id == "run-openai" and error.unit == "tokens" and error.limit == 1_000
    assert error.spent == answered * OPENAI_CALL
    assert error.reserved == 0  # nothing else in flight
    assert error.spent + error.requested > error.limit  # why it was refused
    assert budget.spent.tokens == answered * OPENAI_CALL <= 1_000
    assert budget.remaining.tokens == 1_000 - answered * OPENAI_CALL
    assert "run budget exceeded for run 'run-openai'" in str(error)
    assert all(request.headers[RUN_HEADER] == "run-openai" for request in stub.requests)
    kinds = [event.kind for event in events]
    assert kinds.count("budget_near") == 1 and kinds.count("budget_exceeded") == 1


def test_anthropic_refusals_pass_the_sdk_unwrapped_and_unretried(fuse: Fuse) -> None:
    stub = LLMStub()
    client = anthropic_client(fuse, stub)
    with run("run-anthropic", tokens=700, fuse=fuse) as budget:
        assert ask_anthropic(client) == "Hi!"
        assert ask_anthropic(client) == "Hi!"  # 400 spent, 300 left
        with client.messages.stream(model="m", max_tokens=64, messages=MESSAGES) as stream:  # type: ignore[arg-type]
            assert stream.get_final_text() == "Hi!"  # settled when the stream ended
        assert budget.spent.tokens == 2 * ANTHROPIC_CALL + ANTHROPIC_STREAM
        caught: BudgetExceeded | None = None
        try:
            client.messages.create(model="m", max_tokens=1_000, messages=MESSAGES)  # type: ignore[arg-type]
        except BudgetExceeded as exc:  # what agent code writes
            caught = exc
    assert caught is not None
    assert isinstance(caught, anthropic.AnthropicError)  # so anthropic let it through
    assert caught.requested > 1_000
    assert len(stub.requests) == 3  # the refused call was neither sent nor retried


async def test_async_sdks_reserve_and_settle_the_same_way(fuse: Fuse) -> None:
    stub = LLMStub()
    transport = AsyncFuseTransport(httpx2.MockTransport(stub), fuse=fuse)
    async with httpx2.AsyncClient(transport=transport) as http_client:
        oa = openai.AsyncOpenAI(api_key=OPENAI_KEY, http_client=http_client)
        an = anthropic.AsyncAnthropic(api_key=ANTHROPIC_KEY, http_client=http_client)
        async with run("run-async", tokens=250, fuse=fuse, call_estimate=10) as budget:
            await oa.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
            await an.messages.create(model="m", max_tokens=8, messages=MESSAGES)  # type: ignore[arg-type]
            with pytest.raises(BudgetExceeded):
                await an.messages.create(model="m", max_tokens=8, messages=MESSAGES)  # type: ignore[arg-type]
            state = await budget.aread()
    assert state is not None
    assert (state.spent_tokens, state.reserved_tokens) == (OPENAI_CALL + ANTHROPIC_CALL, 0)
    assert len(stub.requests) == 2


def test_a_call_that_raises_gives_its_reservation_back(fuse: Fuse) -> None:
    def broken(request: Any) -> Any:
        raise httpx2.ConnectError("connection refused")

    client = httpx2.Client(transport=FuseTransport(httpx2.MockTransport(broken), fuse=fuse))
    with run("run-broken", tokens=10_000, fuse=fuse) as budget:
        with pytest.raises(httpx2.ConnectError):
            client.post("https://api.openai.com/v1/chat/completions", json={"max_tokens": 500})
        state = budget.read()
    assert state is not None and (state.spent_tokens, state.reserved_tokens) == (0, 0)


def test_a_stream_closed_early_settles_what_it_read(fuse: Fuse) -> None:
    client = anthropic_client(fuse, LLMStub())
    with run("run-early", tokens=10_000, fuse=fuse) as budget:
        with client.messages.stream(model="m", max_tokens=64, messages=MESSAGES) as stream:  # type: ignore[arg-type]
            next(iter(stream))  # the agent stops reading after the first event
        state = budget.read()
    assert state is not None and state.reserved_tokens == 0  # settled on close, not leaked


def test_nested_runs_all_count_and_a_refusal_by_one_holds_nothing_in_the_others(
    fuse: Fuse,
) -> None:
    stub = LLMStub()
    client = anthropic_client(fuse, stub)
    with run("outer", tokens=10_000, fuse=fuse) as outer:
        with run("inner", tokens=450, fuse=fuse) as inner:
            assert current_runs() == ("outer", "inner")
            ask_anthropic(client)
            ask_anthropic(client)
            with pytest.raises(BudgetExceeded) as caught:
                ask_anthropic(client)
        assert caught.value.run_id == "inner"
        ask_anthropic(client)  # the outer run alone still has room
        outer_state, inner_state = outer.read(), inner.read()
    assert outer_state is not None and inner_state is not None
    assert outer_state.spent_tokens == 3 * ANTHROPIC_CALL
    assert outer_state.reserved_tokens == 0  # the refused call's hold on it was released
    assert inner_state.spent_tokens == 2 * ANTHROPIC_CALL
    assert stub.requests[-1].headers[RUN_HEADER] == "outer"


def test_joining_a_run_by_id_keeps_its_limits(clock: Clock) -> None:
    store = MemoryStore(clock=clock)
    parent, child = Fuse(store, secret="s" * 32), Fuse(store, secret="s" * 32)
    client = anthropic_client(child, LLMStub())
    with run("shared-run", tokens=450, fuse=parent):
        pass  # the orchestrator opened it; a subagent elsewhere joins it by id
    with run("shared-run", fuse=child) as joined:
        assert (joined.last is not None) and joined.last.token_limit == 450
        ask_anthropic(client)
        ask_anthropic(client)
        with pytest.raises(BudgetExceeded):
            ask_anthropic(client)


def test_threads_and_tasks_started_inside_inherit_the_run(fuse: Fuse) -> None:
    client = openai_client(fuse, LLMStub())
    seen: list[tuple[str, ...]] = []
    with run("run-threads", tokens=10_000, fuse=fuse, call_estimate=10) as budget:
        copied = threading.Thread(target=contextvars.copy_context().run, args=(ask_openai, client))
        plain = threading.Thread(target=lambda: seen.append(current_runs()))
        copied.start(), plain.start()
        copied.join(), plain.join()

        async def task() -> tuple[str, ...]:
            return current_runs()

        assert asyncio.run(task()) == ("run-threads",)  # asyncio.run copies the context
        assert budget.spent.tokens == OPENAI_CALL
    assert seen == [()]  # a plain thread does not inherit context variables (Python's rule)
    assert current_runs() == ()


def test_dollars_are_priced_per_model_and_unknown_models_count_in_tokens(
    fuse: Fuse, events: list[FuseEvent]
) -> None:
    genai_prices = pytest.importorskip("genai_prices")
    client = openai_client(fuse, LLMStub())
    with run("run-usd", tokens=100_000, usd=5.0, fuse=fuse, call_estimate=10) as budget:
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES)  # type: ignore[arg-type]
        priced = budget.spent
        client.chat.completions.create(model="no-such-model-x1", messages=MESSAGES)  # type: ignore[arg-type]
        client.chat.completions.create(model="no-such-model-x1", messages=MESSAGES)  # type: ignore[arg-type]
        after = budget.spent
    usage = genai_prices.Usage(input_tokens=19, output_tokens=6)  # openai-chat's counts
    expected = float(genai_prices.calc_price(usage, model_ref="gpt-4o").total_price)
    assert priced.usd == pytest.approx(expected) and priced.usd > 0
    assert after.usd == priced.usd  # the unknown model cost nothing in dollars...
    assert after.tokens == 3 * OPENAI_CALL  # ...and counted in tokens
    unknown = [event for event in events if event.kind == "price_unknown"]
    assert len(unknown) == 1 and "no-such-model-x1" in unknown[0].detail


def test_a_price_table_of_ones_own_wins(fuse: Fuse) -> None:
    client = openai_client(fuse, LLMStub())
    set_prices({"my-finetune": Price(input=1_000.0, output=2_000.0)})
    try:
        with run("run-own-prices", usd=1.0, fuse=fuse, call_estimate=10) as budget:
            client.chat.completions.create(model="my-finetune", messages=MESSAGES)  # type: ignore[arg-type]
            assert budget.spent.usd == pytest.approx((19 * 1_000 + 6 * 2_000) / 1e6)
    finally:
        set_prices({})


def test_a_usd_limit_without_prices_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from tokenfuse._runs import pricing

    monkeypatch.setattr(pricing, "_package", lambda: None)
    with pytest.raises(ConfigurationError, match=r"tokenfuse\[prices\]"):
        run("run-no-prices", usd=1.0)
    run("run-no-prices", tokens=10)  # a token limit needs no prices


def test_bad_run_ids_and_limits_are_clear_errors() -> None:
    for bad in ("", "has space", "x" * 129, "new\nline"):
        with pytest.raises(ConfigurationError, match="run id"):
            run(bad)
    with pytest.raises(ConfigurationError, match="limit"):
        run("ok", tokens=-1)


class FailingStore(MemoryStore):
    def run_many(self, ops: Any) -> list[Any]:
        raise StoreUnavailable("redis is down")


def test_a_failing_store_fails_open_counted_and_reported(clock: Clock) -> None:
    fuse = Fuse(FailingStore(clock=clock))
    seen: list[FuseEvent] = []
    fuse.on_event(seen.append)
    stub = LLMStub()
    client = openai_client(fuse, stub)
    with run("run-down", tokens=1, fuse=fuse, call_estimate=10):
        assert ask_openai(client) == "Hello there!"  # not refused: nothing could be checked
    assert len(stub.requests) == 1
    assert fuse.health.counts.failed >= 2  # the reservation, the settlement (and the open)
    assert any(event.kind == "store_unavailable" for event in seen)


def test_a_fail_closed_fuse_refuses_when_the_store_is_down(clock: Clock) -> None:
    fuse = Fuse(FailingStore(clock=clock), fail_closed=True)
    budget = run("run-closed", tokens=100, fuse=fuse)
    with pytest.raises(StoreUnavailable):
        budget.__enter__()
    assert current_runs() == ()  # nothing was bound


def test_the_top_level_names() -> None:
    assert tokenfuse.run is run
    assert issubclass(tokenfuse.BudgetExceeded, tokenfuse.FuseTripped)


def test_shadow_mode_logs_what_it_would_refuse_and_counts_the_call(
    fuse: Fuse, caplog: pytest.LogCaptureFixture
) -> None:
    stub = LLMStub()
    transport = FuseTransport(httpx2.MockTransport(stub), fuse=fuse, shadow=True)
    client = openai.OpenAI(api_key=OPENAI_KEY, http_client=httpx2.Client(transport=transport))
    with run("run-shadow", tokens=30, fuse=fuse, call_estimate=10) as budget:
        ask_openai(client)
        ask_openai(client)  # 25 spent: this one would be refused
        assert budget.spent.tokens == 2 * OPENAI_CALL  # sent, and counted
    assert len(stub.requests) == 2
    assert "shadow mode, would refuse" in caplog.text


def test_a_dollar_limit_refuses_in_dollars(fuse: Fuse) -> None:
    client = openai_client(fuse, LLMStub())
    set_prices({"pricey": Price(input=10_000.0, output=10_000.0)})  # $0.01 a token
    try:
        with run("run-dollars", usd=0.5, fuse=fuse, call_estimate=10):
            client.chat.completions.create(model="pricey", messages=MESSAGES)  # type: ignore[arg-type]
            with pytest.raises(BudgetExceeded) as caught:
                client.chat.completions.create(model="pricey", messages=MESSAGES)  # type: ignore[arg-type]
    finally:
        set_prices({})
    error = caught.value
    assert (error.unit, error.limit, error.spent) == ("usd", 0.5, pytest.approx(0.25))
    assert error.requested > 0.25  # its estimate in dollars passes what is left
    assert "$0.2500 spent" in str(error) and error.retry_after == 86_400


@pytest.mark.redis
async def test_on_a_real_redis_sync_and_async_calls_share_one_run(
    redis_url: str, redis_prefix: str, clock: Clock
) -> None:
    from tokenfuse import RedisStore

    store = RedisStore.from_url(redis_url, prefix=redis_prefix, clock=clock)
    fuse = Fuse(store, secret="a redis test secret of 32 chars!")
    stub = LLMStub()
    sync_client = anthropic_client(fuse, stub)
    transport = AsyncFuseTransport(httpx2.MockTransport(stub), fuse=fuse)
    try:
        async with httpx2.AsyncClient(transport=transport) as http_client:
            async_client = anthropic.AsyncAnthropic(api_key=ANTHROPIC_KEY, http_client=http_client)
            async with run("run-redis", tokens=500, fuse=fuse) as budget:
                await async_client.messages.create(model="m", max_tokens=8, messages=MESSAGES)  # type: ignore[arg-type]
                assert ask_anthropic(sync_client) == "Hi!"
                with pytest.raises(BudgetExceeded) as caught:
                    await async_client.messages.create(model="m", max_tokens=200, messages=MESSAGES)  # type: ignore[arg-type]
                state = await budget.aread()
    finally:
        await store.aclose()
    assert isinstance(caught.value, anthropic.AnthropicError)
    assert state is not None
    assert (state.spent_tokens, state.reserved_tokens) == (2 * ANTHROPIC_CALL, 0)
    assert len(stub.requests) == 2


class CountingStore(MemoryStore):
    """The embedded store, telling each round trip a fuse makes (one run or run_many)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.trips: list[tuple[str, ...]] = []

    def run(self, op: Any) -> Any:
        self.trips.append((type(op).__name__,))
        return super().run(op)

    def run_many(self, ops: Any) -> list[Any]:
        self.trips.append(tuple(type(op).__name__ for op in ops))
        return [MemoryStore.run(self, op) for op in ops]


def test_the_gate_and_the_reservations_of_nested_runs_go_in_one_round_trip(clock: Clock) -> None:
    store = CountingStore(clock=clock)
    fuse = Fuse(store)
    client = openai_client(fuse, LLMStub())
    with run("outer", tokens=10**6, fuse=fuse), run("inner", tokens=10**5, fuse=fuse):
        store.trips.clear()
        ask_openai(client)
    assert store.trips == [
        # before the call: one round trip (the failure-loop breaker's check goes with it)
        ("Gate", "CheckLoops", "Reserve", "Reserve"),
        # after it: one more, with the breaker's note (it counts the send)
        ("Record", "Settle", "Settle", "NoteLoop"),
    ]


def test_background_records_leave_the_settlements_alone_on_the_callers_path(
    clock: Clock,
) -> None:
    store = CountingStore(clock=clock)
    fuse = Fuse(store)
    transport = FuseTransport(httpx2.MockTransport(LLMStub()), fuse=fuse, record="background")
    client = openai.OpenAI(api_key=OPENAI_KEY, http_client=httpx2.Client(transport=transport))
    with run("run-background", tokens=10**6, fuse=fuse) as budget:
        store.trips.clear()
        ask_openai(client)
        assert store.trips[:2] == [("Gate", "CheckLoops", "Reserve"), ("Settle",)]
        assert budget.spent.tokens == OPENAI_CALL
    transport.close()  # flushes the background record
    assert fuse.status(Identity.secret(OPENAI_KEY)).rate == OPENAI_CALL


def test_a_gate_that_refuses_wins_and_leaves_nothing_reserved(clock: Clock) -> None:
    from tokenfuse import CeilingExceeded, VelocityPolicy

    fuse = Fuse(MemoryStore(clock=clock), velocity=VelocityPolicy(limit=20))
    stub = LLMStub()
    client = openai_client(fuse, stub)
    with run("run-gated", tokens=10_000, fuse=fuse, call_estimate=10) as budget:
        ask_openai(client)  # 25 tokens: over the 20/min ceiling, the key opens
        with pytest.raises(CeilingExceeded):
            ask_openai(client)
        state = budget.read()
    assert state is not None and (state.spent_tokens, state.reserved_tokens) == (25, 0)
    assert len(stub.requests) == 1


def test_a_call_that_reserved_nothing_still_counts_the_usage_it_reports(fuse: Fuse) -> None:
    stub = LLMStub()
    client = httpx2.Client(transport=FuseTransport(httpx2.MockTransport(stub), fuse=fuse))
    with run("run-unreserved", tokens=10_000, fuse=fuse) as budget:
        # No model and no maximum in the body: not taken for an LLM call, so nothing is
        # reserved; the reply reports usage all the same, and that counts.
        client.post("https://api.openai.com/v1/chat/completions", json={"messages": MESSAGES})
        assert budget.spent.tokens == OPENAI_CALL


def test_the_estimate_reads_the_body_the_loop_step_parsed_and_parses_it_once(
    fuse: Fuse, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the failure-loop breaker on, the run's estimate takes the body as the loop step
    parsed it for the fingerprint (no second parse); without it, the step parses it itself.
    Both reserve the same."""
    from tokenfuse._transport import budget_step

    parses: list[bytes | None] = []
    own_parse = budget_step._json_object

    def counted(body: bytes | None) -> dict[str, Any]:
        parses.append(body)
        return own_parse(body)

    monkeypatch.setattr(budget_step, "_json_object", counted)
    reserved: list[float] = []

    def reply(request: Any) -> Any:
        state = budget.read()
        assert state is not None
        reserved.append(state.reserved_tokens)
        return httpx2.Response(200, json={"usage": {"total_tokens": 1}})

    body = {"model": "gpt-4o-mini", "max_tokens": 500, "messages": MESSAGES}
    for breaker in (True, False):
        options: dict[str, Any] = {} if breaker else {"failure_loops": None}
        transport = FuseTransport(httpx2.MockTransport(reply), fuse=fuse, **options)
        client = httpx2.Client(transport=transport)
        with client, run(f"run-one-parse-{breaker}", tokens=10_000, fuse=fuse) as budget:
            client.post("https://api.openai.com/v1/chat/completions", json=body)
        assert len(parses) == (0 if breaker else 1)

    assert reserved[0] == reserved[1] > 500
