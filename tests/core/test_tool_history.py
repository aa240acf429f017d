"""Tool-call loops read from one request body: the three shapes, errors, and the patterns."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from tokenfuse._core.tool_history import (
    ToolCall,
    failing_tail,
    looks_like_error,
    may_hold_results,
    tool_calls,
    tool_loop,
)


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


# -- the transport's shortcut: the failing tail, and bodies with no result ----------------------


def _random_history(rng: random.Random) -> dict[str, Any]:
    """A history in one of the three shapes: calls among a few (so that loops happen), ids
    reused now and then, results failing or not, some calls left without one."""
    shape = rng.choice(("chat", "anthropic", "responses"))
    calls = [("search", {"q": "x"}), ("book", {"id": 7}), ("search", {"q": "y"})]
    results = [FAIL, '{"error": "boom"}', '{"ok": true}', "fine", "Traceback (most recent"]
    items: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for n in range(rng.randint(0, 12)):
        name, arguments = rng.choice(calls)
        call = f"c{rng.randint(0, n)}" if rng.random() < 0.1 else f"c{n}"
        result = rng.choice(results)
        answered = rng.random() < 0.9
        if shape == "chat":
            function = {"name": name, "arguments": json.dumps(arguments)}
            items.append({"role": "assistant", "tool_calls": [{"id": call, "function": function}]})
            if answered:
                items.append({"role": "tool", "tool_call_id": call, "content": result})
        elif shape == "anthropic":
            use = {"type": "tool_use", "id": call, "name": name, "input": arguments}
            items.append({"role": "assistant", "content": [use]})
            if answered:
                block = {"type": "tool_result", "tool_use_id": call, "content": result}
                if rng.random() < 0.3:
                    block["is_error"] = True
                items.append({"role": "user", "content": [block]})
        else:
            asked = {"type": "function_call", "call_id": call, "name": name}
            items.append({**asked, "arguments": json.dumps(arguments)})
            if answered:
                items.append({"type": "function_call_output", "call_id": call, "output": result})
    return {"model": "m", "input" if shape == "responses" else "messages": items}


def test_the_failing_tail_finds_every_loop_the_whole_history_does() -> None:
    """``failing_tail`` reads the history from its end only: over many random histories it
    is the end of ``tool_calls``, and ``tool_loop`` finds the same loops in both."""
    rng = random.Random(12)
    loops_found = 0
    for _ in range(3_000):
        body = _random_history(rng)
        raw = json.dumps(body).encode()
        every = tool_calls(body)
        tail = failing_tail(body, raw)
        assert tail == every[len(every) - len(tail) :]
        assert all(call.failed for call in tail)
        assert len(tail) == len(every) or not every[len(every) - len(tail) - 1].failed
        for repeats, alternations in ((2, 2), (3, 2), (4, 3)):
            found = tool_loop(every, repeats, alternations)
            assert tool_loop(tail, repeats, alternations) == found
            loops_found += found is not None
    assert loops_found > 300  # the histories do hold loops


def test_a_body_naming_no_tool_result_is_not_read() -> None:
    body = chat((*A, FAIL), (*A, FAIL), (*A, FAIL))
    raw = json.dumps(body).encode()
    assert may_hold_results(raw) and failing_tail(body, raw)
    plain = {"model": "m", "messages": [{"role": "user", "content": "tool_use, no result"}]}
    assert not may_hold_results(json.dumps(plain).encode())
    # Told by its bytes that there is no result, the history is not read (a body whose
    # bytes do not match it, as no real body does, shows that).
    assert failing_tail(body, json.dumps(plain).encode()) == []


def test_a_result_spelled_with_unicode_escapes_is_still_read() -> None:
    body = chat((*A, FAIL), (*A, FAIL), (*A, FAIL))
    raw = json.dumps(body).encode()
    escaped = raw.replace(b'"tool_call_id"', b'"tool\\u005fcall_id"')
    assert json.loads(escaped) == body and escaped.find(b"tool_call_id") < 0
    assert may_hold_results(escaped)
    assert tool_loop(failing_tail(json.loads(escaped), escaped), 3, 2) is not None
