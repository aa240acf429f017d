"""Inbound: bind the caller's run for the handler, so a tool server's own LLM calls count
against the run of the agent that called it (``tokenfuse.run``, docs/guards.md#run-budgets).

The run id comes from the ``TokenFuse-Run`` header (what ``FuseTransport`` sends from inside a
run), else from the W3C ``baggage`` entry ``gen_ai.conversation.id`` (what OpenTelemetry-
instrumented agents propagate). It is an untrusted string: one that is too long or has other
characters than a run id may (``A-Za-z0-9_.:@/+=-``, 1-128) is ignored, with a warning at most
once a minute; it reaches the store only as a keyed hash.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from urllib.parse import unquote

from .._events import logger
from .._runs.context import RUN_HEADER, bind_run_id, checked_run_id
from .._throttle import Throttle
from .request import RequestView

__all__ = ["BAGGAGE_KEY", "run_id_of", "run_of"]

#: The W3C baggage entry naming the conversation (OpenTelemetry's GenAI conventions).
BAGGAGE_KEY = "gen_ai.conversation.id"
_MAX_BAGGAGE = 8_192  # the W3C limit on a baggage header
_RUN_HEADER = RUN_HEADER.lower()
_NO_RUN = nullcontext()  # stateless: one for every request that carries no run
_warnings = Throttle(60.0)


def _from_baggage(header: str | None) -> str | None:
    if not header or len(header) > _MAX_BAGGAGE:
        return None
    for member in header.split(","):
        key, sep, value = member.partition("=")
        if sep and key.strip() == BAGGAGE_KEY:
            return unquote(value.split(";", 1)[0].strip())
    return None


def run_id_of(request: RequestView) -> str | None:
    """The run id the request carries, if any and valid."""
    raw = request.header(_RUN_HEADER)
    if raw is None:
        baggage = request.header_list("baggage")
        if baggage is None:  # most requests: neither header
            return None
        raw = _from_baggage(baggage)
    if raw is None:
        return None
    run_id = checked_run_id(raw.strip())
    if run_id is None and _warnings.take() is not None:
        logger.warning(
            "tokenfuse: ignored a run id that is not one (%d characters; 1-128 of "
            "A-Za-z0-9_.:@/+=- expected) on %s %s",
            len(raw), request.method, request.path[:200],
        )  # fmt: skip
    return run_id


def run_of(request: RequestView) -> AbstractContextManager[object]:
    """A context in which the request's run (if any) is bound for the handler."""
    run_id = run_id_of(request)
    return _NO_RUN if run_id is None else bind_run_id(run_id)
