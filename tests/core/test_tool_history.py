"""Tool-call loops read from one request body: the three shapes, errors, and the patterns."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tokenfuse._core.tool_history import ToolCall, looks_like_error, tool_calls, tool_loop


def chat(*turns: tuple[str, dict[str, Any], str]) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for n, (name, arguments, result) in enumerate(turns):
        function = {"name": name, "arguments": json.dumps(arguments)}
        call = {"id": f"c{n}", "function": function}
        messages.append({"role": "assistant", "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{n}", "content": result})
    return {"model": "m", "messages": messages}


FAIL = "Error: the service is down"
A, B, C = ("search", {"q": "x"}), ("book", {"id": 7}), ("search", {"q": "y"})


def loop_of(body: dict[str, Any], repeats: int = 3, alternations: int = 2) -> Any:
    return tool_loop(tool_calls(body), repeats, alternations)


def test_the_same_failing_call_three_times_in_a_row() -> None:
    found = loop_of(chat((*A, FAIL), (*A, FAIL), (*A, FAIL)))
    assert found is not None and found.tools == ("search",) and found.count == 3
    assert loop_of(chat((*A, FAIL), (*A, FAIL))) is None  # twice is not yet a loop


def test_arguments_in_another_key_order_are_the_same_call() -> None:
    body = chat((*A, FAIL), (*A, FAIL), (*A, FAIL))
    body["messages"][3]["tool_calls"][0]["function"]["arguments"] = '{ "q" : "x" }'
    assert loop_of(body) is not None


def test_only_a_loop_still_going_on_counts() -> None:
    assert loop_of(chat((*A, FAIL), (*A, FAIL), (*A, FAIL), (*A, '{"ok": true}'))) is None
    assert loop_of(chat((*A, FAIL), (*A, FAIL), (*C, FAIL))) is None  # trying something else


def test_two_failing_calls_taking_turns() -> None:
    found = loop_of(chat((*A, FAIL), (*B, FAIL), (*A, FAIL), (*B, FAIL)))
    assert found is not None and found.tools == ("search", "book") and found.count == 4
    assert loop_of(chat((*A, FAIL), (*B, FAIL), (*A, FAIL))) is None
    assert loop_of(chat((*A, FAIL), (*B, FAIL), (*C, FAIL), (*B, FAIL))) is None


def test_anthropic_is_error_and_responses_items() -> None:
    messages: list[dict[str, Any]] = []
    for n in range(3):
        use = {"type": "tool_use", "id": f"t{n}", "name": "run", "input": {"cmd": "ls"}}
        result = {"type": "tool_result", "tool_use_id": f"t{n}", "is_error": True, "content": "x"}
        messages += [{"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]
    assert loop_of({"messages": messages}) is not None
    items: list[dict[str, Any]] = []
    for n in range(3):
        items.append(
            {"type": "function_call", "call_id": f"c{n}", "name": "run", "arguments": "{}"}
        )
        output = "Traceback (most recent call last):\n..."
        items.append({"type": "function_call_output", "call_id": f"c{n}", "output": output})
    assert loop_of({"input": items}) is not None


@pytest.mark.parametrize(
    ("content", "failed"),
    [
        ("Error: timeout", True),
        ("  exception raised", True),
        ("could not connect", True),
        ('{"error": "boom"}', True),
        ('{"status": "failed"}', True),
        ({"isError": True}, True),
        ([{"type": "text", "text": "ERROR 42"}], True),
        ("The error rate is 3%", False),
        ('{"result": 12}', False),
        ("", False),
        (None, False),
        (12, False),
    ],
)
def test_what_looks_like_an_error(content: Any, failed: bool) -> None:
    assert looks_like_error(content) is failed


@pytest.mark.parametrize(
    "body",
    [
        None,
        [],
        "x",
        {"messages": "x"},
        {"messages": [1, None, {"role": "assistant", "tool_calls": 3}]},
        {"messages": [{"role": "tool", "tool_call_id": "nope", "content": FAIL}]},
        {"input": [{"type": "function_call", "call_id": None}]},
    ],
)
def test_odd_bodies_have_no_calls_and_never_raise(body: Any) -> None:
    assert tool_loop(tool_calls(body), 3, 2) is None


def test_calls_without_a_result_are_not_counted() -> None:
    body = chat((*A, FAIL), (*A, FAIL))
    body["messages"].append(
        {
            "role": "assistant",
            "tool_calls": [{"id": "late", "function": {"name": "search", "arguments": "{}"}}],
        }
    )
    assert [call.failed for call in tool_calls(body)] == [True, True]
    assert tool_calls(body)[0] == ToolCall("search", '{"q":"x"}', True)
