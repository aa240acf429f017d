"""The built-in providers: one `UsageShape` row each, and the endpoints that route to them.

Where each provider reports its usage, and why these fields and totals, is in
``docs/usage-formats.md``; the SDK types agree. `*_details` objects are subsets of their
parents and never added.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from .model import ResponseFacts, Usage, UsageReader, UsageShape, header_count
from .readers import FixedReader, ReaderPlan, endpoint_plan

# Where generated text sits: chat deltas and messages, legacy completions (`text`), tool call
# arguments, reasoning; the Responses API streams it as `delta` strings (its `text` and
# `output` repeat the whole answer at the end, so they are not counted twice).
_OPENAI_TEXT = ("content", "text", "arguments", "reasoning_content", "reasoning", "refusal")
_OPENAI_INPUT = ("prompt_tokens", "input_tokens")  # chat/completions/embeddings vs Responses
_OPENAI_OUTPUT = ("completion_tokens", "output_tokens")
_ANTHROPIC_INPUT = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
_RESPONSES_END = frozenset({b"response.completed", b"response.incomplete", b"response.failed"})

OPENAI = UsageShape(
    # Groq reports stream usage under x_groq (top-level usage only with include_usage).
    containers=(("usage",), ("x_groq", "usage")),
    input=_OPENAI_INPUT,
    output=_OPENAI_OUTPUT,
    total=("total_tokens",),
    missing_hint="no usage in stream (stream_options.include_usage not set?)",
    text_keys=_OPENAI_TEXT,
)
OPENAI_RESPONSES = replace(
    OPENAI,
    containers=(("usage",), ("response", "usage")),
    end_events=_RESPONSES_END,
    missing_hint="no usage in stream",
    text_keys=("delta",),
)
ANTHROPIC = UsageShape(
    containers=(("usage",), ("message", "usage")),  # message_delta / body, message_start
    input=_ANTHROPIC_INPUT,
    output=("output_tokens",),
    end_events=frozenset({b"message_stop"}),
    whole_objects=False,
)
GEMINI = UsageShape(
    containers=(("usageMetadata",),),
    input=("promptTokenCount", "toolUsePromptTokenCount"),
    output=("candidatesTokenCount", "thoughtsTokenCount"),
    total=("totalTokenCount",),  # prompt + candidates would miss thinking tokens
    end_keys=(b'"finishReason"',),
)
BEDROCK = UsageShape(
    containers=(("usage",),),
    input=("inputTokens", "cacheReadInputTokens", "cacheWriteInputTokens"),
    output=("outputTokens",),
    total=("totalTokens",),
    end_events=frozenset({b"metadata"}),
)
BEDROCK_INVOKE_STREAM = UsageShape(
    containers=(("amazon-bedrock-invocationMetrics",),),
    input=("inputTokenCount",),
    output=("outputTokenCount",),
    end_keys=(b"amazon-bedrock-invocationMetrics",),
)
COHERE = UsageShape(
    containers=(("usage", "tokens"), ("delta", "usage", "tokens")),  # body, message-end event
    input=("input_tokens",),
    output=("output_tokens",),
    end_events=frozenset({b"message-end"}),
)
OLLAMA = UsageShape(
    containers=((),),  # counts sit on the final `"done": true` object itself
    input=("prompt_eval_count",),
    output=("eval_count",),
    end_keys=(b'"done":true', b'"done": true'),
)
OLLAMA_EMBED = UsageShape(containers=((),), input=("prompt_eval_count",), output=())
GENERIC = UsageShape(
    containers=(("usage",), ("response", "usage"), ("message", "usage")),
    input=(*_OPENAI_INPUT, *_ANTHROPIC_INPUT[1:]),
    output=_OPENAI_OUTPUT,
    total=("total_tokens",),
    end_events=_RESPONSES_END | ANTHROPIC.end_events,
    whole_objects=False,
    missing_hint=OPENAI.missing_hint,
    text_keys=_OPENAI_TEXT,
)


@dataclass(frozen=True, slots=True)
class Route:
    """An endpoint, recognised by a regex searched in the URL path."""

    pattern: re.Pattern[str]
    shape: UsageShape | None  # None: the endpoint counts nothing by design
    provider: str | None = None  # None: named after the host (OpenAI-compatible servers)
    header_counts: bool = False  # Bedrock InvokeModel reports usage in response headers


def _route(
    pattern: str, shape: UsageShape | None, provider: str | None = None, **kw: bool
) -> Route:
    return Route(re.compile(pattern), shape, provider, **kw)


ROUTES = (
    _route(r"/responses/input_tokens$", None),
    _route(r"/v1/messages/count_tokens$", None, "anthropic"),
    _route(r":countTokens$", None, "gemini"),
    _route(r"/model/[^/]+/count-tokens$", None, "bedrock"),
    _route(r"/count-tokens:rawPredict$", None, "anthropic"),  # Claude on Vertex AI
    _route(r"/model/[^/]+/invoke-with-response-stream$", BEDROCK_INVOKE_STREAM, "bedrock"),
    _route(r"/model/[^/]+/invoke$", GENERIC, "bedrock", header_counts=True),
    _route(r"/model/[^/]+/converse(-stream)?$", BEDROCK, "bedrock"),
    _route(r":(stream)?[gG]enerateContent$", GEMINI, "gemini"),
    _route(r"/publishers/anthropic/models/[^/]+:(stream)?[rR]awPredict$", ANTHROPIC, "anthropic"),
    _route(r"/v1/messages$", ANTHROPIC, "anthropic"),
    _route(r"/v2/chat$", COHERE, "cohere"),
    _route(r"/api/embed$", OLLAMA_EMBED, "ollama"),
    _route(r"/api/(chat|generate)$", OLLAMA, "ollama"),
    _route(r"/responses$", OPENAI_RESPONSES),
    _route(r"/(chat/completions|completions|embeddings)$", OPENAI),
)

# Host (or parent domain) -> provider label, for OpenAI-compatible endpoints and unknown paths.
HOSTS = {
    "api.openai.com": "openai",
    "openai.azure.com": "azure",
    "cognitiveservices.azure.com": "azure",
    "services.ai.azure.com": "azure",
    "api.groq.com": "groq",
    "api.mistral.ai": "mistral",
    "openrouter.ai": "openrouter",
    "api.anthropic.com": "anthropic",
    "api.cohere.com": "cohere",
    "api.cohere.ai": "cohere",
    "generativelanguage.googleapis.com": "gemini",
}


_CACHE_SIZE = 1024  # distinct hosts and paths remembered; past it, the memory starts over
_hosts: dict[str, str | None] = {}


def _known_host(host: str) -> str | None:
    """The provider of `host` or of a parent domain in `HOSTS`; remembered per host."""
    try:
        return _hosts[host]
    except KeyError:
        pass
    name, found = host, None
    while name:
        if name in HOSTS:
            found = HOSTS[name]
            break
        name = name.partition(".")[2]
    if len(_hosts) >= _CACHE_SIZE:
        _hosts.clear()
    _hosts[host] = found
    return found


def host_provider(info: ResponseFacts, default: str) -> str:
    found = _known_host(info.host)
    if found is not None:
        return found
    if info.path.startswith("/openai/deployments/"):
        return "azure"  # Azure OpenAI behind a custom domain or gateway
    return default


# Providers whose OpenAI-style streams report usage without being asked: the request is left
# as it is (Groq under `x_groq`, Mistral and OpenRouter on the last chunk).
_REPORT_UNASKED = frozenset({"groq", "mistral", "openrouter"})


def takes_usage_option(host: str, path: str) -> bool:
    """Whether a stream from ``path`` on ``host`` reports usage only when the request asks for it
    with ``stream_options.include_usage`` (see `request.with_usage_option`).

    >>> takes_usage_option("api.openai.com", "/v1/chat/completions")
    True
    >>> takes_usage_option("api.groq.com", "/openai/v1/chat/completions")
    False
    """
    # Chat completions and legacy completions, as OpenAI and the servers like it serve them.
    return path.endswith("/completions") and _known_host(host) not in _REPORT_UNASKED


def _header_usage(headers: Mapping[str, str]) -> Usage | None:
    input_ = header_count(headers.get("x-amzn-bedrock-input-token-count"))
    output = header_count(headers.get("x-amzn-bedrock-output-token-count"))
    if input_ is None or output is None:
        return None
    return Usage(total=input_ + output, input=input_, output=output, provider="bedrock")


_routes: dict[str, Route | None] = {}


def route_for(path: str) -> Route | None:
    """The first route whose pattern is in `path`, or None.

    A client calls few distinct paths, each many times: remember the answer rather than try
    up to every pattern (one regex search each) on every call.
    """
    try:
        return _routes[path]
    except KeyError:
        pass
    found = next((route for route in ROUTES if route.pattern.search(path)), None)
    if len(_routes) >= _CACHE_SIZE:
        _routes.clear()  # paths with ids in them must not grow memory
    _routes[path] = found
    return found


class _HeaderCounts:
    """Bedrock InvokeModel: the usage its response headers report, or else its body's."""

    __slots__ = ("_body",)

    def __init__(self, body: ReaderPlan) -> None:
        self._body = body

    def reader(self, info: ResponseFacts) -> UsageReader | None:
        usage = _header_usage(info.response_headers)
        return FixedReader(usage) if usage is not None else self._body.reader(info)


def _builtin_plan(info: ResponseFacts) -> ReaderPlan:
    route = route_for(info.path)
    if route is None:
        return endpoint_plan(info, GENERIC, host_provider(info, "generic"), sniff=False)
    provider = route.provider or host_provider(info, "openai-compatible")
    plan = endpoint_plan(info, route.shape, provider)
    if route.header_counts and info.ok and info.method == "POST":
        return _HeaderCounts(plan)
    return plan


_PlanKey = tuple[str, str, str, int, str, str, bool]
_plans: dict[_PlanKey, ReaderPlan] = {}


def builtin_reader(info: ResponseFacts) -> UsageReader | None:
    """The reader for a response from any built-in provider, or the generic `usage` reader.

    Which one depends on a few facts of the response only (below); a client gets responses of
    few kinds, each many times, so each kind's plan is worked out once and remembered.
    """
    # The facts as they come, not as the plan reads them (`ok`, `content_type` and
    # `content_encoding`, each a property): each is one function of what is in the key, so
    # the plan is the same, and a response of a known kind costs two header lookups, no more
    # (a content-type whose parameters change with each response only costs a plan each).
    headers = info.response_headers
    key = (
        info.method,
        info.host,
        info.path,
        info.status_code,
        headers.get("content-type", ""),
        headers.get("content-encoding", ""),
        info.estimate,
    )
    plan = _plans.get(key)
    if plan is None:
        plan = _builtin_plan(info)
        if len(_plans) >= _CACHE_SIZE:
            _plans.clear()  # paths with ids in them must not grow memory
        _plans[key] = plan
    return plan.reader(info)
