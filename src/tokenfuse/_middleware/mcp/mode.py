"""MCP mode's settings: what ``TokenFuse(app, mcp=...)`` takes besides ``True``."""

from __future__ import annotations

from dataclasses import dataclass

from ..._errors import ConfigurationError
from .body import DEFAULT_MAX_BODY
from .failures import ToolFailures
from .replies import RefuseAs

__all__ = ["McpMode"]

_DEFAULT_FAILURES = ToolFailures()  # frozen: one shared default is safe


@dataclass(frozen=True, slots=True)
class McpMode:
    """MCP mode's settings: ``TokenFuse(app, mcp=McpMode(...))``; ``mcp=True`` takes these.

    >>> McpMode(methods=("tools/call", "resources/read")).refuse_as
    'result'
    """

    methods: tuple[str, ...] = ("tools/call",)
    """The JSON-RPC methods that are charged; any of ``tools/call``, ``resources/read``,
    ``prompts/get``. Everything else is free."""
    failures: ToolFailures | None = _DEFAULT_FAILURES
    """The failure-loop breaker for tools; None turns it off."""
    refuse_as: RefuseAs = "result"
    """``"result"``: a refused ``tools/call`` is answered with an ``isError`` tool result
    (the model reads it); ``"error"``: with a JSON-RPC error."""
    max_body: int = DEFAULT_MAX_BODY
    """Bytes of request body read to classify it; a larger body is charged at the highest
    price."""

    @staticmethod
    def of(value: bool | McpMode | None) -> McpMode | None:
        if value is None or value is False:
            return None
        if value is True:
            return McpMode()
        if isinstance(value, McpMode):
            return value
        raise ConfigurationError(f"mcp must be True, False or an McpMode, not {value!r}")

    def __post_init__(self) -> None:
        if self.refuse_as not in ("result", "error"):
            raise ConfigurationError(
                f"refuse_as must be 'result' or 'error', not {self.refuse_as!r}"
            )
        size = self.max_body
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ConfigurationError(f"max_body must be a positive integer, not {size!r}")
