"""The Lua source of each operation: ``lua/_lib.lua`` (the policy core) before its body.

Redis runs the whole chunk of a script on every EVALSHA, and each ``local function`` in it
costs a closure then (about as much as a PING's server time, per function). So the loader
keeps, in their order, only the library's top-level ``local`` definitions that the body uses,
directly or through other definitions: the gate, run before every outbound call, carries a
dozen of the forty-odd. Nothing is rewritten; every kept line is the library's own.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

__all__ = ["SCRIPTS", "script_sources", "shake"]

SCRIPTS = ("gate", "record", "admit", "status", "reset", "configure")

_DEFINITION = re.compile(r"local\s+(?:function\s+)?([\w\s,]+?)\s*(?:=|\(|--|$)")
_NAME = re.compile(r"[A-Za-z_]\w*")
_COMMENT = re.compile(r"--\[\[.*?\]\]|--[^\n]*", re.DOTALL)


def _names(lua: str) -> set[str]:
    return set(_NAME.findall(_COMMENT.sub("", lua)))


def _definitions(lib: str) -> list[tuple[set[str], str]]:
    """Top-level ``local`` statements, each with the comment lines right above it."""
    parts: list[tuple[set[str], list[str]]] = []
    pending: list[str] = []
    for line in lib.splitlines():
        match = _DEFINITION.match(line)
        if match:
            names = {name.strip() for name in match.group(1).split(",")}
            parts.append((names, [*pending, line]))
            pending = []
        elif line.startswith("--") or not line.strip():
            pending.append(line)  # may be the comment of the next definition
        elif parts:
            parts[-1][1].extend([*pending, line])  # the body of the current definition
            pending = []
    return [(names, "\n".join(lines)) for names, lines in parts]


def shake(lib: str, body: str) -> str:
    """``body`` preceded by the definitions of ``lib`` it needs, in their original order."""
    needed = _names(body)
    kept = []
    for names, text in reversed(_definitions(lib)):  # a definition only uses earlier ones
        if names & needed:
            kept.append(text)
            needed |= _names(text)
    return "\n".join([*reversed(kept), body])


@functools.cache
def script_sources() -> dict[str, str]:
    folder = resources.files(__package__) / "lua"
    lib = (folder / "_lib.lua").read_text("utf-8")
    return {name: shake(lib, (folder / f"{name}.lua").read_text("utf-8")) for name in SCRIPTS}
