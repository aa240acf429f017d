"""An agent framework in front of the guarded server: pydantic-ai's ``MCPToolset`` (over the
mcp 2.x client) with a scripted model that calls ``refund`` in a loop, as a stuck model would,
until a tool answer stops it. The model must *see* the refusal, not a transport error."""

from __future__ import annotations

import json
import uuid

import pytest
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from tests.mcp_mode.conftest import CAPACITY, McpServer

pytestmark = pytest.mark.slow

LOOP_BOUND = 60


def runaway_model(seen: list[str]) -> FunctionModel:
    """Calls refund again after every answer; stops at the first answer that is not a
    successful refund, and returns the text it read there."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        last = messages[-1].parts[-1]
        if isinstance(last, (ToolReturnPart, RetryPromptPart)):
            # pydantic-ai hands a tool's error back as a retry prompt or a failed tool return,
            # depending on its version: read the text either way.
            text = last.model_response() if isinstance(last, RetryPromptPart) else str(last.content)
            seen.append(text)
            if "refunded" not in text or len(seen) >= LOOP_BOUND:
                return ModelResponse(parts=[TextPart(f"stopped: {text}")])
        args = json.dumps({"order": "A-1001", "amount": 25})
        return ModelResponse(parts=[ToolCallPart("refund", args)])

    return FunctionModel(respond)


async def test_the_model_reads_the_refusal_of_its_runaway_loop(server_v2: McpServer) -> None:
    before = server_v2.stats()
    key = f"sk-agent-{uuid.uuid4().hex}"
    toolset = MCPToolset(server_v2.url, headers={"Authorization": f"Bearer {key}"})
    seen: list[str] = []
    agent = Agent(runaway_model(seen), toolsets=[toolset])

    result = await agent.run("refund order A-1001 until it works")

    refunds = CAPACITY // 5
    assert len(seen) == refunds + 1
    assert all("refunded 25.0 on A-1001" in text for text in seen[:refunds])
    assert "tool 'refund' was not run: call quota exhausted" in seen[-1]
    assert result.output.startswith("stopped: ")
    assert "tool 'refund' was not run" in result.output
    after = server_v2.stats()
    assert after.get("refund", 0) - before.get("refund", 0) == refunds
