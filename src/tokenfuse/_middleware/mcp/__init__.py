"""MCP mode: the middleware in front of an MCP server speaks JSON-RPC.

::

    POST body ─ read_body ─ Classifier ─┬─ free (protocol messages) ─────────── app
    (body.py)   (bounded,   (classify.py)└─ charged ─ McpGate.admit ─┬─ refusal (replies.py)
                 replayed)                           (gate.py)       └─ app ─ ResponseWatch
                                                                              (watch.py)
                                                        failed calls ─ FailureLoopBreaker
                                                                        (failures.py)

``asgi.py`` serves it behind ``TokenFuse(app, mcp=True)``; ``hook.py`` serves the same gate as
an mcp 2.x server middleware. Per-tool keys and companion fuses live in ``keys.py``, the
settings in ``mode.py``.
"""

# Only what the options need: the gate and the shells import the middleware's guard, which
# imports the options, so they are loaded when an MCP-mode middleware is built.
from .classify import CHARGEABLE_METHODS, Call, Classifier, Exchange
from .failures import ToolFailureLoop, ToolFailures
from .mode import McpMode
from .replies import META_KEY, RATE_LIMITED

__all__ = [
    "CHARGEABLE_METHODS",
    "META_KEY",
    "RATE_LIMITED",
    "Call",
    "Classifier",
    "Exchange",
    "McpMode",
    "ToolFailureLoop",
    "ToolFailures",
]
