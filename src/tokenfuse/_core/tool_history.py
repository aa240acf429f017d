"""Tool-call loops read from one request: the model asking again for a call that just failed.

An agent sends the whole conversation with each LLM request, so the request itself shows a
stuck agent: the model asked for a tool call, the tool answered with an error, the model asked
for the very same call (same tool, same arguments), the tool failed again, and so on; or it
takes turns between two such calls (A, B, A, B). No store is needed: the history is the state.

``tool_calls`` reads the calls and whether each one's result was an error from the three
request shapes (OpenAI chat ``messages`` with ``tool_calls`` and ``tool`` messages, OpenAI
responses ``input`` with ``function_call`` and ``function_call_output`` items, Anthropic
``messages`` with ``tool_use`` and ``tool_result`` blocks); ``tool_loop`` looks at the end of
that history: only a loop still going on counts (one the agent got out of is history).

As every request carries the whole history, the transport reads only what ``tool_loop``
looks at: ``may_hold_results`` skips a body with no tool result at all (a byte search), and
``failing_tail`` reads the calls from the end, up to the last one that did not fail.

A result is an error when it says so (Anthropic's ``is_error``; a JSON result with a truthy
``error``, ``is_error``/``isError``, or ``status`` "error"/"failed") or looks like one (its
text starts with "error", "exception", "traceback", "failed", ... or holds a Python
traceback). Nothing of a result's text is kept: only whether it failed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ToolCall",
    "ToolLoop",
    "failing_tail",
    "looks_like_error",
    "may_hold_results",
    "tool_calls",
    "tool_loop",
]

#: How much of a result's text is looked at to decide whether it is an error.
_HEAD = 400
_ERROR_START = re.compile(
    r"^\W{0,3}(error|exception|traceback|failed|failure|fatal|tool error|an error occurred"
    r"|invalid|unable to|cannot|could not)\b",
    re.IGNORECASE,
)
_TRACEBACK = "Traceback (most recent call last)"
_FAILED_STATUSES = frozenset({"error", "failed", "failure"})
_TOOL_NAME = re.compile(r"[^A-Za-z0-9_.:-]+")


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call of the history and whether its result was an error."""

    name: str
    arguments: str
    """Canonical JSON of the arguments (keys sorted), or their text when not JSON."""
    failed: bool

    @property
    def same_as(self) -> tuple[str, str]:
        return (self.name, self.arguments)


@dataclass(frozen=True, slots=True)
class ToolLoop:
    """A loop at the end of the history: ``tools`` is one name (the same call each time) or
    two (taking turns); ``count`` is the failing calls in it."""

    tools: tuple[str, ...]
    count: int

    @property
    def tool(self) -> str:
        return "/".join(self.tools)


def _canonical(arguments: Any) -> str:
    if isinstance(arguments, str):
        text: str = arguments
        try:
            arguments = json.loads(text)
        except (ValueError, RecursionError):
            return text
    try:
        return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return repr(arguments)


def _text(content: Any) -> str:
    """The text of a result's content: a string, or the text parts of a list."""
    if isinstance(content, str):
        return content[:_HEAD]
    if isinstance(content, list):
        parts = []
        for part in content[:8]:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"][:_HEAD])
            elif isinstance(part, str):
                parts.append(part[:_HEAD])
        return "\n".join(parts)[:_HEAD]
    return ""


def looks_like_error(content: Any) -> bool:
    """Whether a tool result's content says, or looks like, it failed."""
    if isinstance(content, dict):
        return _says_failed(content)
    text = _text(content).strip()
    if not text:
        return False
    if text.startswith("{"):
        try:
            parsed = json.loads(_text(content) if isinstance(content, str) else text)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            return _says_failed(parsed)
    return bool(_ERROR_START.match(text)) or _TRACEBACK in text


def _says_failed(result: dict[str, Any]) -> bool:
    if result.get("error") or result.get("is_error") is True or result.get("isError") is True:
        return True
    status = result.get("status")
    return isinstance(status, str) and status.lower() in _FAILED_STATUSES


def _name(value: Any) -> str:
    return _TOOL_NAME.sub("_", value)[:64] if isinstance(value, str) else "?"


#: A result's call id -> (its ``is_error`` flag, its content): read only when it counts.
_Results = dict[str, tuple[bool, Any]]
#: A call id -> (name, arguments) as asked, made canonical only when the call counts.
_Asked = dict[str, tuple[Any, Any]]


def may_hold_results(body: bytes) -> bool:
    """Whether a raw request body may hold a tool result (False: ``tool_calls`` of it is
    empty for sure). A few C-level searches: most requests skip reading their history.

    Every result names its call with a key or a type written in the body: ``tool_call_id``
    (OpenAI chat), ``function_call_output`` (OpenAI responses), ``tool_result`` (Anthropic),
    unless JSON spelled it with ``\\u`` escapes (allowed, if never seen): such a body is read."""
    return (
        body.find(b"tool_call_id") >= 0  # find: `in` would first format (and drop) a TypeError
        or body.find(b"function_call_output") >= 0
        or body.find(b"tool_result") >= 0
        or body.find(b"\\u") >= 0
    )


def tool_calls(body: Any) -> list[ToolCall]:
    """The tool calls of a request's history that have a result, in the order asked."""
    asked, order, results = _history(_items(body))
    return [_call(asked, results, call) for call in order if call in results]


def failing_tail(body: Any, raw: bytes | None = None) -> list[ToolCall]:
    """The failing calls at the end of ``tool_calls(body)`` (all that ``tool_loop`` looks at),
    reading no call before them: a long history costs one pass over its items, and only its
    tail's arguments are made canonical and its results read. ``raw``: the body's bytes, to
    skip a history that holds no result at all (``may_hold_results``)."""
    items = _items(body)
    if not items or (raw is not None and not may_hold_results(raw)):
        return []
    asked, order, results = _history(items)
    tail: list[ToolCall] = []
    for call in reversed(order):
        if call not in results:
            continue
        found = _call(asked, results, call)
        if not found.failed:
            break
        tail.append(found)
    tail.reverse()
    return tail


def _call(asked: _Asked, results: _Results, call: str) -> ToolCall:
    name, arguments = asked[call]
    is_error, content = results[call]
    return ToolCall(_name(name), _canonical(arguments), is_error or looks_like_error(content))


def _items(body: Any) -> list[Any] | None:
    """The history: a chat's ``messages``, or a response's ``input`` items."""
    if not isinstance(body, dict):
        return None
    items = body.get("messages")
    if not isinstance(items, list):
        items = body.get("input")
    return items if isinstance(items, list) else None


def _history(items: list[Any] | None) -> tuple[_Asked, list[str], _Results]:
    """The calls asked (in order) and the results given, as found in the items (unread)."""
    asked: _Asked = {}
    order: list[str] = []
    results: _Results = {}
    for item in items or ():
        if isinstance(item, dict):
            _read_item(item, asked, order, results)
    return asked, order, results


def _ask(asked: _Asked, order: list[str], call: Any, name: Any, arguments: Any) -> None:
    if isinstance(call, str) and call not in asked:
        asked[call] = (name, arguments)
        order.append(call)


def _read_item(item: dict[str, Any], asked: _Asked, order: list[str], results: _Results) -> None:
    kind = item.get("type")
    if kind == "function_call":  # OpenAI responses
        _ask(asked, order, item.get("call_id"), item.get("name"), item.get("arguments"))
        return
    if kind == "function_call_output":
        call = item.get("call_id")
        if isinstance(call, str):
            results[call] = (False, item.get("output"))
        return
    role = item.get("role")
    if role == "assistant":
        tool_calls = item.get("tool_calls")
        for tool_call in tool_calls if isinstance(tool_calls, list) else ():  # OpenAI chat
            if isinstance(tool_call, dict):
                function = tool_call.get("function")
                if isinstance(function, dict):
                    _ask(asked, order, tool_call.get("id"), function.get("name"),
                         function.get("arguments"))  # fmt: skip
    if role == "tool":
        call = item.get("tool_call_id")
        if isinstance(call, str):
            results[call] = (False, item.get("content"))
        return
    content = item.get("content")
    if not isinstance(content, list):
        return
    for block in content:  # Anthropic
        if not isinstance(block, dict):
            continue
        if block.get("type") == "tool_use":
            _ask(asked, order, block.get("id"), block.get("name"), block.get("input"))
        elif block.get("type") == "tool_result":
            call = block.get("tool_use_id")
            if isinstance(call, str):
                results[call] = (block.get("is_error") is True, block.get("content"))


def tool_loop(calls: list[ToolCall], repeats: int, alternations: int) -> ToolLoop | None:
    """The loop at the end of ``calls``: the same failing call ``repeats`` times in a row, or
    two failing calls taking turns ``alternations`` times each; None when there is none."""
    run = 0
    for call in reversed(calls):  # the failing calls at the end
        if not call.failed:
            break
        run += 1
    tail = calls[len(calls) - run :]
    if not tail:
        return None
    same = 1
    while same < len(tail) and tail[-1 - same].same_as == tail[-1].same_as:
        same += 1
    if same >= repeats:
        return ToolLoop((tail[-1].name,), same)
    if len(tail) >= 2 and tail[-1].same_as != tail[-2].same_as:
        turns = 2
        while turns < len(tail) and tail[-1 - turns].same_as == tail[-1 - turns + 2].same_as:
            turns += 1
        if turns >= 2 * alternations:
            return ToolLoop((tail[-2].name, tail[-1].name), turns)
    return None
