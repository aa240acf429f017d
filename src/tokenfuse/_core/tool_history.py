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

__all__ = ["ToolCall", "ToolLoop", "looks_like_error", "tool_calls", "tool_loop"]

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


def tool_calls(body: Any) -> list[ToolCall]:
    """The tool calls of a request's history that have a result, in the order asked."""
    if not isinstance(body, dict):
        return []
    asked: dict[str, tuple[str, str]] = {}  # call id -> (name, arguments)
    order: list[str] = []
    failed: dict[str, bool] = {}
    items = body.get("messages")
    if not isinstance(items, list):
        items = body.get("input")
    if not isinstance(items, list):
        return []
    for item in items:
        if not isinstance(item, dict):
            continue
        _read_item(item, asked, order, failed)
    return [
        ToolCall(asked[call][0], asked[call][1], failed[call]) for call in order if call in failed
    ]


def _ask(asked: dict[str, tuple[str, str]], order: list[str], call: Any, name: Any,
         arguments: Any) -> None:  # fmt: skip
    if isinstance(call, str) and call not in asked:
        asked[call] = (_name(name), _canonical(arguments))
        order.append(call)


def _read_item(
    item: dict[str, Any],
    asked: dict[str, tuple[str, str]],
    order: list[str],
    failed: dict[str, bool],
) -> None:
    kind = item.get("type")
    if kind == "function_call":  # OpenAI responses
        _ask(asked, order, item.get("call_id"), item.get("name"), item.get("arguments"))
        return
    if kind == "function_call_output":
        call = item.get("call_id")
        if isinstance(call, str):
            failed[call] = looks_like_error(item.get("output"))
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
            failed[call] = looks_like_error(item.get("content"))
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
                failed[call] = block.get("is_error") is True or looks_like_error(
                    block.get("content")
                )


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
