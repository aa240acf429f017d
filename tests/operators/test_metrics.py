"""Metrics scraped from real registries: Prometheus text from a CollectorRegistry, and the
GenAI histogram read back with the OpenTelemetry SDK's in-memory reader."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tests.conftest import Clock
from tokenfuse import (
    BucketPolicy,
    Fuse,
    FuseTransport,
    MemoryStore,
    StoreUnavailable,
    VelocityPolicy,
)
from tokenfuse.fuse import Identity
from tokenfuse.metrics import GenAITokenUsage, Tally, TallyCollector, install

OPENAI = "https://api.openai.com/v1/chat/completions"
GEMINI = "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:generateContent"


class Scrape:
    """A registry of the test's own, with a tally installed for the test's length."""

    def __init__(self, tally: Tally) -> None:
        self.tally = tally
        self.registry = CollectorRegistry()
        self.registry.register(TallyCollector(tally))

    def value(self, name: str, **labels: str) -> float:
        found = self.registry.get_sample_value(name, labels)
        return 0.0 if found is None else found

    def text(self) -> str:
        return generate_latest(self.registry).decode()


@pytest.fixture
def scrape() -> Iterator[Scrape]:
    tally = Tally(keys={"agent-listed"}, top=2)
    remove = install(tally)
    yield Scrape(tally)
    remove()


def openai_llm(
    prompt: int = 1_000, completion: int = 500
) -> Callable[[httpx.Request], httpx.Response]:
    def answer(request: httpx.Request) -> httpx.Response:
        usage = {"prompt_tokens": prompt, "completion_tokens": completion}
        return httpx.Response(200, json={"model": "gpt-4o-2024", "usage": usage})

    return answer


def chat(client: httpx.Client, model: str = "gpt-4o-mini", url: str = OPENAI) -> httpx.Response:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})
    return client.post(url, content=body)


def guarded(fuse: Fuse, llm: Callable[[httpx.Request], httpx.Response]) -> httpx.Client:
    transport = FuseTransport(httpx.MockTransport(llm), fuse=fuse)
    return httpx.Client(
        transport=transport, headers={"authorization": "Bearer sk-test-0123456789abcdef"}
    )


def test_tokens_are_counted_by_provider_model_and_type(scrape: Scrape, clock: Clock) -> None:
    client = guarded(Fuse(MemoryStore(clock=clock)), openai_llm(1_000, 500))
    for _ in range(3):
        chat(client)
    chat(client, model="gpt-5")
    labels = {"provider": "openai", "estimated": "false"}
    assert (
        scrape.value("tokenfuse_tokens_total", model="gpt-4o-mini", token_type="input", **labels)
        == 3_000
    )
    assert (
        scrape.value("tokenfuse_tokens_total", model="gpt-4o-mini", token_type="output", **labels)
        == 1_500
    )
    assert (
        scrape.value("tokenfuse_tokens_total", model="gpt-5", token_type="input", **labels) == 1_000
    )


def test_the_model_in_the_path_wins_and_models_are_capped(scrape: Scrape, clock: Clock) -> None:
    def gemini(request: httpx.Request) -> httpx.Response:
        usage = {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15}
        return httpx.Response(200, json={"usageMetadata": usage})

    client = guarded(Fuse(MemoryStore(clock=clock)), gemini)
    chat(client, url=GEMINI)
    assert (
        scrape.value(
            "tokenfuse_tokens_total",
            provider="gemini",
            model="gemini-2.5-flash",
            token_type="output",
            estimated="false",
        )
        == 5
    )
    from tokenfuse._metrics.tally import MAX_MODELS

    openai = guarded(Fuse(MemoryStore(clock=clock)), openai_llm(1, 1))
    for n in range(MAX_MODELS + 5):
        chat(openai, model=f"model-{n}")
    models = {labels[1] for labels in scrape.tally.snapshot()["tokens"]}
    assert len(models) == MAX_MODELS + 1 and "other" in models


@pytest.mark.parametrize(
    ("url", "facts"),
    [
        (GEMINI, ("gemini-2.5-flash", "generate_content")),
        # %-encoded: the labels are the decoded path's, whether or not it was seen before
        (GEMINI.replace("gemini-2.5", "gemini%2D2%2E5"), ("gemini-2.5-flash", "generate_content")),
        (
            GEMINI.replace(":generateContent", "%3AgenerateContent"),
            ("gemini-2.5-flash", "generate_content"),
        ),
        (OPENAI + "?api-version=1", ("gpt-4o-mini", "chat")),
        ("https://example.com/v1/embeddings?q=%2Fmodels%2Fx", ("gpt-4o-mini", "embeddings")),
        ("https://example.com/v1/anything", ("gpt-4o-mini", "unknown")),
    ],
)
def test_call_facts_read_the_decoded_path_every_time(url: str, facts: tuple[str, str]) -> None:
    from tokenfuse._observe import call_facts

    body = json.dumps({"model": "gpt-4o-mini"}).encode()
    for _ in range(2):  # the second time, from what the first remembered
        found = call_facts(httpx.Request("POST", url, content=body))
        assert (found.model, found.operation) == facts


def test_decisions_refusals_trips_and_open_keys(scrape: Scrape, clock: Clock) -> None:
    fuse = Fuse(MemoryStore(clock=clock), velocity=VelocityPolicy(limit=2_000, cooldown=60))
    client = guarded(fuse, openai_llm(1_000, 500))
    chat(client)
    chat(client)  # 3,000 tokens/min: this record trips
    with pytest.raises(Exception, match="rate over the ceiling"):
        chat(client)  # refused at the gate
    out = {"layer": "outbound", "fuse": "default"}
    assert (
        scrape.value("tokenfuse_decisions_total", operation="gate", outcome="allowed", **out) == 2
    )
    assert (
        scrape.value("tokenfuse_decisions_total", operation="gate", outcome="refused", **out) == 1
    )
    assert (
        scrape.value("tokenfuse_decisions_total", operation="record", outcome="refused", **out) == 1
    )
    assert scrape.value("tokenfuse_trips_total", reason="manual_ceiling", **out) == 1
    assert scrape.value("tokenfuse_refusals_total", reason="manual_ceiling", **out) == 2
    assert scrape.value("tokenfuse_keys_open", fuse="default") == 1
    count = scrape.value("tokenfuse_decision_seconds_count", layer="outbound", operation="gate")
    fastest = scrape.value(
        "tokenfuse_decision_seconds_bucket", layer="outbound", operation="gate", le="1.0"
    )
    assert count == fastest == 3
    fuse.reset(Identity.secret("sk-test-0123456789abcdef"))
    chat(client)  # allowed again: no longer counted as open
    assert scrape.value("tokenfuse_keys_open", fuse="default") == 0


def test_inbound_quota_refusals_and_a_near_limit_episode(scrape: Scrape, clock: Clock) -> None:
    fuse = Fuse(MemoryStore(clock=clock), name="inbound", bucket=BucketPolicy(rate=1, capacity=5))
    for _ in range(8):
        fuse.admit("caller-1")
    inbound = {"layer": "inbound", "fuse": "inbound"}
    assert scrape.value("tokenfuse_refusals_total", reason="quota_exhausted", **inbound) == 3
    assert scrape.value("tokenfuse_keys_open", fuse="inbound") == 0  # an empty bucket opens nothing
    for _ in range(7 * 60):  # seven minutes at the refill rate: hot all along
        clock.advance(1)
        fuse.admit("caller-1")
    assert scrape.value("tokenfuse_near_limit_episodes_total", fuse="inbound") == 1


def test_lease_mode_counts_every_decision_once(scrape: Scrape, clock: Clock) -> None:
    """Calls decided from a lease count as the admits they stand for, renewals as leases:
    the same totals as the direct mode."""
    from tokenfuse._core.lease import LeasePolicy
    from tokenfuse._leases import Leases

    fuse = Fuse(MemoryStore(clock=clock), name="inbound", bucket=BucketPolicy(rate=1, capacity=5))
    leases = Leases(fuse, LeasePolicy(size=2), clock=clock, background=False)
    assert [leases.admit("caller-1").allowed for _ in range(8)] == [True] * 5 + [False] * 3
    inbound = {"layer": "inbound", "fuse": "inbound"}

    def decisions(operation: str, outcome: str) -> float:
        return scrape.value(
            "tokenfuse_decisions_total", operation=operation, outcome=outcome, **inbound
        )

    assert (decisions("lease", "allowed"), decisions("admit", "allowed")) == (2, 3)
    assert (decisions("lease", "refused"), decisions("admit", "refused")) == (1, 2)
    assert scrape.value("tokenfuse_refusals_total", reason="quota_exhausted", **inbound) == 3


def test_failure_loops_are_counted_and_open_no_key(scrape: Scrape, clock: Clock) -> None:
    def failing(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": {"type": "invalid_request_error"}})

    client = guarded(Fuse(MemoryStore(clock=clock)), failing)
    for _ in range(3):
        chat(client)  # 400, 400, 400: the third trips the call
    with pytest.raises(Exception, match="failure loop"):
        chat(client)  # refused before sending
    out = {"layer": "outbound", "fuse": "default"}
    assert scrape.value("tokenfuse_trips_total", reason="failure_loop", **out) == 1
    assert scrape.value("tokenfuse_refusals_total", reason="failure_loop", **out) == 2
    assert (
        scrape.value("tokenfuse_decisions_total", operation="check_loops", outcome="refused", **out)
        == 1
    )
    assert scrape.value("tokenfuse_keys_open", fuse="default") == 0  # one call, not the key


def test_inbound_failure_loops_are_counted_from_the_shared_round_trip(
    scrape: Scrape, clock: Clock
) -> None:
    """The middleware sends its failure-loop check with the admission: each is still counted
    as its own decision, and a request the bucket refuses counts no loop decision."""
    from wsgiref.util import setup_testing_defaults

    from tokenfuse.middleware import TokenFuseWSGI

    def tool(environ: dict[str, Any], start: Callable[..., Any]) -> list[bytes]:
        start("422 Unprocessable Entity", [("Content-Type", "application/json")])
        return [b'{"error": "bad arguments"}']

    bucket = BucketPolicy(rate=1, capacity=5)
    fuse = Fuse(MemoryStore(clock=clock), name="inbound", bucket=bucket, velocity=None)
    app = TokenFuseWSGI(tool, fuse=fuse)

    def call() -> str:
        environ: dict[str, Any] = {"REQUEST_METHOD": "POST", "PATH_INFO": "/tools/lookup"}
        environ["HTTP_X_API_KEY"] = "sk-agent-0001"
        setup_testing_defaults(environ)
        found: list[str] = []
        body = app(environ, lambda status, headers, exc=None: found.append(status))
        b"".join(body)
        getattr(body, "close", lambda: None)()
        return found[0].split()[0]

    assert [call() for _ in range(6)] == ["422"] * 3 + ["429"] * 3  # the 6th: the bucket
    inbound = {"layer": "inbound", "fuse": "inbound"}

    def decisions(operation: str, outcome: str) -> float:
        return scrape.value(
            "tokenfuse_decisions_total", operation=operation, outcome=outcome, **inbound
        )

    assert (decisions("admit", "allowed"), decisions("admit", "refused")) == (5, 1)
    assert (decisions("check_loops", "allowed"), decisions("check_loops", "refused")) == (3, 2)
    # the trip (the third failure noted) and the two requests refused before the app
    assert scrape.value("tokenfuse_refusals_total", reason="failure_loop", **inbound) == 3
    assert scrape.value("tokenfuse_trips_total", reason="failure_loop", **inbound) == 1


def test_the_key_rate_of_an_inbound_caller_is_its_admissions_not_its_loop_checks(
    scrape: Scrape, clock: Clock
) -> None:
    """The middleware's failure-loop check goes with the admission of the same key: its
    decision (one call's count, the failures that trip it) must not replace the key's rate
    and threshold in the per-key series."""
    from wsgiref.util import setup_testing_defaults

    from tokenfuse._loops import FailureLoopPolicy
    from tokenfuse._middleware import CALL_VELOCITY, inbound_fuse
    from tokenfuse.middleware import TokenFuseWSGI

    def tool(environ: dict[str, Any], start: Callable[..., Any]) -> list[bytes]:
        start("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]

    fuse = inbound_fuse(MemoryStore(clock=clock), velocity=CALL_VELOCITY)
    app = TokenFuseWSGI(tool, fuse=fuse)
    for _ in range(4):
        environ: dict[str, Any] = {"REQUEST_METHOD": "POST", "PATH_INFO": "/tools/lookup"}
        environ["HTTP_X_API_KEY"] = "agent-listed"
        setup_testing_defaults(environ)
        b"".join(app(environ, lambda status, headers, exc=None: None))

    caller = fuse.status(Identity.secret("agent-listed"))
    (seen,) = [key for key in scrape.tally.busiest() if key.label == caller.key]
    admission = fuse.admit(Identity.secret("agent-listed"), amount=0)  # reads the threshold
    assert seen.rate == caller.rate == 4.0  # four calls admitted (a loop check's count: 0)
    assert seen.threshold == admission.limit != FailureLoopPolicy().failures


class FailingStore:
    def run(self, op: object) -> object:
        raise StoreUnavailable("down")

    async def arun(self, op: object) -> object:
        raise StoreUnavailable("down")


def test_store_errors_and_degraded_decisions(scrape: Scrape) -> None:
    fuse = Fuse(FailingStore())
    for _ in range(5):
        assert fuse.record("agent-1", 10).degraded
    out = {"layer": "outbound", "fuse": "default"}
    # Three failures open the back-off: the other two decisions skip the store.
    assert scrape.value("tokenfuse_store_errors_total", fuse="default", operation="record") == 3
    assert (
        scrape.value("tokenfuse_decisions_total", operation="record", outcome="degraded", **out)
        == 5
    )


def test_per_key_series_only_for_the_allow_list_and_the_busiest(
    scrape: Scrape, clock: Clock
) -> None:
    fuse = Fuse(MemoryStore(clock=clock))
    for n in range(1, 40):
        fuse.record(f"agent-{n}", 100.0 * n)
    fuse.record("agent-listed", 1.0)
    series = {
        line.split("key=")[1].split('"')[1]
        for line in scrape.text().splitlines()
        if line.startswith("tokenfuse_key_rate{")
    }
    assert series == {"agent-39", "agent-38", "agent-listed"}
    listed = fuse.key_id("agent-listed")
    assert (
        scrape.value("tokenfuse_key_rate", fuse="default", key_id=listed, key="agent-listed") == 1.0
    )
    threshold = scrape.value(
        "tokenfuse_key_threshold", fuse="default", key_id=listed, key="agent-listed"
    )
    assert threshold == 100_000.0  # the cold-start ceiling: no baseline yet


def test_metrics_add_no_store_round_trip(scrape: Scrape, clock: Clock) -> None:
    class Counting(MemoryStore):
        runs = 0

        def run(self, op: Any) -> Any:
            Counting.runs += 1
            return super().run(op)

    store = Counting(clock=clock)
    client = guarded(Fuse(store), openai_llm())
    for _ in range(10):
        chat(client)
    # a gate, a failure-loop check, a record and the loop note (its send) per call, as
    # without metrics; the note, riding with the record, is decided only when it trips or
    # repeats (these five identical calls make one repeat loop)
    assert Counting.runs == 40
    assert sum(scrape.tally.snapshot()["decisions"].values()) == 31


def test_a_failing_observer_never_breaks_a_call(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken:
        def decided(self, *args: object) -> None:
            raise RuntimeError("observer bug")

        def store_failed(self, *args: object) -> None:
            raise RuntimeError("observer bug")

    remove = install(Broken())
    try:
        fuse = Fuse(MemoryStore(clock=clock))
        assert fuse.record("agent-1", 10).allowed
        assert fuse.record("agent-1", 10).allowed
    finally:
        remove()
    failures = [record for record in caplog.records if "failed; the call goes on" in record.message]
    assert len(failures) == 1  # logged once, not per call


def test_the_default_registry_has_the_metrics_with_no_code() -> None:
    code = (
        "import tokenfuse\n"
        "from prometheus_client import REGISTRY\n"
        "tokenfuse.Fuse().record('agent-1', 10)\n"
        "print(REGISTRY.get_sample_value('tokenfuse_decisions_total', {'layer': 'outbound',"
        " 'fuse': 'default', 'operation': 'record', 'outcome': 'allowed'}))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENFUSE_")}
    on = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert float(on.stdout) == 1.0, on.stderr
    off = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "TOKENFUSE_METRICS": "0"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert off.stdout.strip() == "None", off.stderr


# -- OpenTelemetry -----------------------------------------------------------------------------


def test_the_genai_token_usage_histogram(clock: Clock) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    remove = install(GenAITokenUsage(provider))
    try:
        client = guarded(Fuse(MemoryStore(clock=clock)), openai_llm(1_000, 500))
        chat(client)
        chat(client)
    finally:
        remove()
        chat(client)  # not recorded any more
    (metric,) = [
        metric
        for resource in reader.get_metrics_data().resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    ]
    assert (metric.name, metric.unit) == ("gen_ai.client.token.usage", "{token}")
    points = {point.attributes["gen_ai.token.type"]: point for point in metric.data.data_points}
    assert set(points) == {"input", "output"}
    assert (points["input"].count, points["input"].sum) == (2, 2_000)
    assert (points["output"].count, points["output"].sum) == (2, 1_000)
    assert dict(points["input"].attributes) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-4o-mini",
        "gen_ai.token.type": "input",
    }


def test_the_histogram_follows_a_meter_provider_set_after_it(clock: Clock) -> None:
    # Without a MeterProvider the API's proxy drops every value, and the observer skips the
    # work; a provider set later (the application configuring OpenTelemetry after tokenfuse
    # is imported) is recorded on from the next call.
    from opentelemetry.metrics._internal import _ProxyMeterProvider
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    proxy = _ProxyMeterProvider()
    remove = install(GenAITokenUsage(proxy))
    reader = InMemoryMetricReader()
    try:
        client = guarded(Fuse(MemoryStore(clock=clock)), openai_llm(1_000, 500))
        chat(client)  # nowhere to go: dropped
        proxy.on_set_meter_provider(MeterProvider(metric_readers=[reader]))
        chat(client)
    finally:
        remove()
    points = [
        point
        for resource in reader.get_metrics_data().resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        for point in metric.data.data_points
    ]
    assert sorted((p.attributes["gen_ai.token.type"], p.count, p.sum) for p in points) == [
        ("input", 1, 1_000),
        ("output", 1, 500),
    ]


def test_every_metric_is_documented_and_the_dashboard_uses_only_real_ones(
    scrape: Scrape, clock: Clock
) -> None:
    import re
    from pathlib import Path

    docs = Path(__file__).resolve().parents[2] / "docs"
    fuse = Fuse(MemoryStore(clock=clock), velocity=VelocityPolicy(limit=10))
    fuse.record("agent-listed", 20)
    families = {family.name: family.type for family in TallyCollector(scrape.tally).collect()}
    exposed = {f"{name}_total" if kind == "counter" else name for name, kind in families.items()}
    documented = set(re.findall(r"`(tokenfuse_[a-z_]+)`", (docs / "metrics.md").read_text()))
    assert exposed == documented
    dashboard = (docs / "grafana-dashboard.json").read_text()
    used = {
        re.sub(r"_(bucket|count|sum)$", "", name)
        for name in re.findall(r"tokenfuse_[a-z_]+", dashboard)
    }
    assert used - {"tokenfuse"} <= exposed


def test_a_fuse_works_where_opentelemetry_is_not_installed() -> None:
    # find_spec("opentelemetry.metrics") raises, rather than answering None, when the parent
    # package is missing: the first Fuse of such a process must not.
    code = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "from tokenfuse import Fuse\n"
        "print(Fuse().record('agent', 5).allowed)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"


class DecidedOnly:
    """An observer with ``decided`` alone (no ``loop_passed``): what a plain failure-loop check
    counts when its ``Decision`` is made and observed as every other decision is."""

    def __init__(self) -> None:
        self.tally = Tally(top=5)
        self.seen: list[tuple[str, Any]] = []

    def decided(self, fuse: Fuse, op: Any, decision: Any, seconds: float) -> None:
        self.seen.append((op.name, decision))
        self.tally.decided(fuse, op, decision, seconds)

    def store_failed(self, fuse: Fuse, op: Any, error: Exception) -> None:
        self.tally.store_failed(fuse, op, error)


def test_a_plain_loop_check_counts_as_its_decision_would(clock: Clock) -> None:
    """The middleware's plain loop checks reach ``Tally.loop_passed`` with no ``Decision``:
    every count, the latency's too, and the open keys are the ones ``decided`` would give, and
    an observer without ``loop_passed`` still gets the decision it always got."""
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from tokenfuse.middleware import TokenFuse

    quick, slow = Tally(top=5), DecidedOnly()
    removes = [install(quick), install(slow)]
    try:
        bucket = BucketPolicy(rate=1, capacity=3)
        fuse = Fuse(MemoryStore(clock=clock), name="inbound", bucket=bucket, velocity=None)
        app = Starlette(routes=[Route("/tool", lambda request: PlainTextResponse("ok"))])
        client = TestClient(TokenFuse(app, fuse=fuse))
        auth = {"X-API-Key": "sk-agent-0001"}
        answers = [client.get("/tool", headers=auth).status_code for _ in range(5)]
        clock.advance(10.0)  # the bucket refilled: the refused key is closed by the next
        answers.append(client.get("/tool", headers=auth).status_code)
    finally:
        for remove in removes:
            remove()
    assert answers == [200, 200, 200, 429, 429, 200]
    assert quick.snapshot() == slow.tally.snapshot()
    assert quick.open_keys(now=0.0) == slow.tally.open_keys(now=0.0)
    assert quick.snapshot()["decisions"][("inbound", "inbound", "check_loops", "allowed")] == 4
    checks = [decision for name, decision in slow.seen if name == "check_loops"]
    caller = Identity.secret("sk-agent-0001")
    key_id = fuse.key_id(caller)
    assert len(checks) == 4
    for d in checks:
        assert (d.key, d.key_id, d.allowed, d.error) == (caller.label, key_id, True, None)
        assert (d.rate, d.limit, d.degraded, d.tripped, d.bucket) == (0.0, 3.0, False, False, None)


def test_loop_passed_closes_the_key_as_an_allowed_decision_does() -> None:
    from dataclasses import replace

    from tokenfuse._errors import CeilingExceeded
    from tokenfuse._fuse import Decision
    from tokenfuse._stores.ops import Admit, CheckLoops
    from tokenfuse._transport import FailureLoopPolicy

    fuse = Fuse(MemoryStore(), name="inbound", bucket=BucketPolicy(rate=1, capacity=3))
    check = CheckLoops("inbound:k", "0" * 16, FailureLoopPolicy().core, True)
    admit = Admit("inbound:k", 1.0, 1.0, fuse.velocity, fuse.bucket)
    error = CeilingExceeded(key="agent", rate=9.0, limit=5.0, retry_after=60.0)
    refusal = Decision(key="agent", allowed=False, error=error, rate=9.0, limit=5.0)
    tallies = Tally(), Tally()
    for tally in tallies:
        tally.decided(fuse, admit, refusal, 0.001)  # the key opened, for a minute
    assert tallies[0].open_keys(now=0.0) == tallies[1].open_keys(now=0.0) == {"inbound": 1}
    tallies[0].loop_passed(fuse, check, 0.00003)
    tallies[1].decided(fuse, check, Decision(key="agent", allowed=True, limit=3.0), 0.00003)
    assert tallies[0].open_keys(now=0.0) == tallies[1].open_keys(now=0.0) == {}
    assert tallies[0].snapshot() == tallies[1].snapshot()
    busiest = [[replace(key, seen=0.0) for key in tally.busiest(now=0.0)] for tally in tallies]
    assert busiest[0] == busiest[1] and len(busiest[0]) == 1  # the admission's rate alone
