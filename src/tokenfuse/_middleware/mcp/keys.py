"""The per-tool keys of MCP mode, and the fuses that judge them.

Besides the caller's own key (its bucket and call velocity, weighted by cost), a charged
call is judged under the **caller × tool** key: the velocity check per tool, so a caller
looping on ``refund`` trips for ``refund`` against ``refund``'s own baseline, even when its
busy ``lookup`` traffic hides the loop in the caller's total. Judged by a companion fuse named
``<fuse>.tools`` with the inbound fuse's velocity policy and no bucket (the bucket stays per
caller). (The failing calls of the failure-loop breaker are kept with the caller's own key:
``failures.py``.)

Keys are identities derived from the caller's (``Identity.derived``: hashed from its digest
and the tool name), keyed by the fuse's secret as every identity is: no tool name or argument
reaches the store. Labels, for messages, name the caller and the tool.
"""

from __future__ import annotations

from ..._core.velocity import VelocityPolicy
from ..._fuse import Fuse
from ..._identity import Identity
from .classify import Call

__all__ = ["companion", "tool_key"]

_LABEL_NAME = 48


def _label(caller: Identity, call: Call) -> str:
    kind = "tool" if call.is_tool_call else call.method.split("/")[0].rstrip("s")
    name = "".join(ch if ch.isprintable() else "?" for ch in call.name[:_LABEL_NAME])
    return f"{caller.label} {kind} {name}"


def tool_key(caller: Identity, call: Call) -> Identity:
    """The caller × tool identity of the per-tool velocity check."""
    return caller.derived("tool", call.method, call.name, label=_label(caller, call))


def companion(fuse: Fuse, suffix: str, velocity: VelocityPolicy) -> Fuse:
    """A bucket-less fuse on ``fuse``'s store, health and event hooks, under its own name."""
    other = Fuse(
        fuse.store,
        name=f"{fuse.name}.{suffix}"[:64],
        velocity=velocity,
        bucket=None,
        fail_closed=fuse.fail_closed,
        health=fuse.health,
        secret=fuse._secret,  # the same keys and key ids as the caller's own fuse
    )
    other.hooks = fuse.hooks  # events reach the user's hooks, added before or after this
    return other
