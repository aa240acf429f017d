"""LiteLLM, SDK and Router, guarded with ``guard_litellm``: every provider's client, refusals
that are neither resent nor held against a Router deployment."""

from __future__ import annotations

import gc
import pickle
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import httpx
import litellm
import pytest

import tokenfuse
from tokenfuse import CeilingExceeded, ConfigurationError, Fuse, FuseTripped
from tokenfuse.integrations.litellm import LiteLLMGuard, as_litellm_error, guard_litellm

from .conftest import UNTIL_TRIP
from .stub import AgentServer

# LiteLLM trips warnings of its own (not ours to fix) that pytest would raise: pydantic ones,
# and the event loop its sync calls make for async logging and never close (its self-pipe is
# an AF_UNIX socket pair). Sockets to the server (AF_INET) left open still fail a test.
UNRAISABLE = "pytest.PytestUnraisableExceptionWarning"
pytestmark = [
    pytest.mark.filterwarnings("ignore:Items? .* (is|are) using the `ReadOnly` qualifier"),
    pytest.mark.filterwarnings("ignore:Accessing the 'model_(computed_)?fields' attribute"),
    pytest.mark.filterwarnings(f"ignore:.*BaseEventLoop.__del__:{UNRAISABLE}"),
    pytest.mark.filterwarnings(rf"ignore:.*<socket.socket fd=\d+, family=1,:{UNRAISABLE}"),
]


@pytest.fixture(autouse=True, scope="module")
def _collect_litellm_garbage() -> Iterator[None]:
    # Collected here, under this module's filters, not during another module's tests.
    yield
    gc.collect()


MESSAGES = [{"role": "user", "content": "find it"}]
#: A bound on every test loop, far above the calls tokenfuse lets through.
TURNS = 10


@pytest.fixture
def guard(fuse: Fuse) -> Iterator[LiteLLMGuard]:
    with guard_litellm(fuse=fuse) as installed:
        yield installed


@pytest.fixture
async def aguard(fuse: Fuse) -> AsyncIterator[LiteLLMGuard]:
    """The guard of an async test: its clients are closed on the test's event loop."""
    async with guard_litellm(fuse=fuse) as installed:
        yield installed


def openai_deployment(server: AgentServer, api_key: str) -> dict[str, Any]:
    return {"model": "openai/stub", "api_base": f"{server.base}/v1", "api_key": api_key}


def anthropic_deployment(server: AgentServer, api_key: str) -> dict[str, Any]:
    return {"model": "anthropic/claude-stub", "api_base": server.base, "api_key": api_key}


DEPLOYMENTS = [
    pytest.param(openai_deployment, id="openai"),
    pytest.param(anthropic_deployment, id="anthropic"),
]


def run_loop(call: Callable[[], Any]) -> BaseException:
    """Call until refused (at most ``TURNS`` times); the exception LiteLLM raised."""
    for _ in range(TURNS):
        try:
            drain(call())
        except Exception as exc:
            return exc
    raise AssertionError(f"{TURNS} calls and no refusal")


async def arun_loop(call: Callable[[], Awaitable[Any]]) -> BaseException:
    for _ in range(TURNS):
        try:
            response = await call()
            if isinstance(response, litellm.CustomStreamWrapper):
                async for _ in response:
                    pass
        except Exception as exc:
            return exc
    raise AssertionError(f"{TURNS} calls and no refusal")


def drain(response: Any) -> None:
    if isinstance(response, litellm.CustomStreamWrapper):
        for _ in response:
            pass


def assert_refused(exc: BaseException) -> FuseTripped:
    """LiteLLM's form of a refusal: a 400 whose cause is the tokenfuse refusal."""
    assert isinstance(exc, litellm.BadRequestError), repr(exc)
    assert exc.status_code == 400
    with pytest.raises(CeilingExceeded) as caught, tokenfuse.unwrap_refusals():
        raise exc
    return caught.value


@pytest.mark.usefixtures("guard")
@pytest.mark.parametrize("deployment", DEPLOYMENTS)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_sdk_loop_is_stopped(
    server: AgentServer, api_key: str, deployment: Callable[..., dict[str, Any]], stream: bool
) -> None:
    params = deployment(server, api_key)
    # OpenAI-compatible streams carry usage only when asked (OpenAI's own URL is asked for).
    options = {"stream_options": {"include_usage": True}} if stream else {}
    exc = run_loop(
        lambda: litellm.completion(messages=MESSAGES, stream=stream, **params, **options)
    )
    assert_refused(exc)
    assert server.count(api_key) == UNTIL_TRIP


@pytest.mark.usefixtures("aguard")
@pytest.mark.parametrize("deployment", DEPLOYMENTS)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_async_sdk_loop_is_stopped(
    server: AgentServer, api_key: str, deployment: Callable[..., dict[str, Any]], stream: bool
) -> None:
    params = deployment(server, api_key)
    options = {"stream_options": {"include_usage": True}} if stream else {}
    exc = await arun_loop(
        lambda: litellm.acompletion(messages=MESSAGES, stream=stream, **params, **options)
    )
    assert_refused(exc)
    assert server.count(api_key) == UNTIL_TRIP


@pytest.mark.usefixtures("guard")
def test_retries_are_refused_before_sending(server: AgentServer, api_key: str) -> None:
    params = anthropic_deployment(server, api_key)
    exc = run_loop(lambda: litellm.completion(messages=MESSAGES, num_retries=3, **params))
    assert_refused(exc)
    assert server.count(api_key) == UNTIL_TRIP


def two_deployment_router(server: AgentServer, keys: list[str]) -> litellm.Router:
    model_list = [
        {"model_name": "agent-model", "litellm_params": anthropic_deployment(server, key)}
        for key in keys
    ]
    return litellm.Router(model_list=model_list, num_retries=2)


@pytest.mark.usefixtures("aguard")
async def test_router_keeps_serving_other_agents_after_one_trips(server: AgentServer) -> None:
    keys = ["sk-router-a1", "sk-router-a2"]
    router = two_deployment_router(server, keys)

    async def ask() -> Any:
        return await router.acompletion(model="agent-model", messages=MESSAGES)

    with tokenfuse.scope("runaway-agent"):
        exc = await arun_loop(ask)
        assert_refused(exc)
        for _ in range(3):  # the runaway keeps being refused, at the gate
            assert_refused(await arun_loop(ask))
    sent = sum(server.count(key) for key in keys)
    assert sent == UNTIL_TRIP
    with tokenfuse.scope("other-agent"):
        for _ in range(2):
            response = await ask()
            assert response.usage.total_tokens == 60_000
    assert sum(server.count(key) for key in keys) == sent + 2


def test_sync_router_keeps_serving_other_agents(server: AgentServer, fuse: Fuse) -> None:
    keys = ["sk-router-s1", "sk-router-s2"]
    with guard_litellm(fuse=fuse):
        router = two_deployment_router(server, keys)

        def ask() -> Any:
            return router.completion(model="agent-model", messages=MESSAGES)

        with tokenfuse.scope("runaway-agent"):
            assert_refused(run_loop(ask))
        with tokenfuse.scope("other-agent"):
            assert ask().usage.total_tokens == 60_000
    assert sum(server.count(key) for key in keys) == UNTIL_TRIP + 1


@pytest.mark.parametrize(
    ("key", "budgets"), [("litellm", 1), (None, 2)], ids=["default-one-budget", "per-credential"]
)
def test_router_identity_does_not_multiply_the_budget(
    server: AgentServer, fuse: Fuse, key: str | None, budgets: int
) -> None:
    keys = [f"sk-budget-{key}-1", f"sk-budget-{key}-2"]
    with guard_litellm(fuse=fuse, key=key):
        router = two_deployment_router(server, keys)
        # The Router picks a deployment at random for each call: in 30 calls both are picked
        # often enough to spend each budget there is (all but certainly: 1 - 4e-7).
        for _ in range(30):
            try:
                router.completion(model="agent-model", messages=MESSAGES)
            except litellm.BadRequestError as exc:
                assert_refused(exc)
    assert sum(server.count(k) for k in keys) == UNTIL_TRIP * budgets


def test_close_puts_litellm_back(server: AgentServer, fuse: Fuse, api_key: str) -> None:
    with guard_litellm(fuse=fuse):
        assert litellm.client_session is not None
    assert litellm.client_session is None
    assert litellm.sync_transport is None
    params = anthropic_deployment(server, api_key)
    for _ in range(UNTIL_TRIP + 1):  # no longer counted: nothing refuses the fourth call
        litellm.completion(messages=MESSAGES, **params)
    assert server.count(api_key) == UNTIL_TRIP + 1


def test_a_client_the_application_set_is_not_overwritten(fuse: Fuse) -> None:
    own = httpx.Client()
    litellm.client_session = own
    try:
        with pytest.raises(ConfigurationError, match="client_session is already set"):
            guard_litellm(fuse=fuse)
    finally:
        litellm.client_session = None
        own.close()


def test_the_refusal_litellm_sees_pickles_as_the_refusal() -> None:
    refusal = CeilingExceeded(key="agent-7", rate=120_000, limit=100_000, retry_after=60)
    seen = as_litellm_error(refusal)
    assert isinstance(seen, litellm.BadRequestError)
    assert isinstance(seen, CeilingExceeded)
    assert (seen.key, seen.retry_after) == ("agent-7", 60)
    back = pickle.loads(pickle.dumps(seen))
    assert type(back) is CeilingExceeded
    assert back.as_dict() == refusal.as_dict()
