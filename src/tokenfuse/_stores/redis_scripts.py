"""The Lua source of each operation: the libraries (``lua/_lib.lua``, the policy core, then
``lua/_budget.lua``, run budgets) before its body.

Redis runs the whole chunk of a script on every EVALSHA, and each ``local function`` in it
costs a closure then, more for every outer local it captures (an upvalue). So the loader

- writes the library's constants (``local NAME = <number or 'string'>``, NAME in capitals)
  into the code as their literals, outside comments and strings: no function captures them;
- keeps, in their order, only the library's top-level ``local`` definitions that the body
  uses, directly or through other definitions: the gate, run before every outbound call,
  carries seven of the forty-odd.

Nothing else is rewritten; every other kept line is the library's own.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

from .redis_codec import CODECS

__all__ = ["SCRIPTS", "inline_constants", "script_sources", "shake"]

#: One script per operation ``RedisStore`` runs, named after it (``ReadState`` and
#: ``ReadStatus`` share ``status``: one read, two views of its reply).
SCRIPTS = tuple(dict.fromkeys(op.name for op in CODECS))

#: The libraries every script may use, in order (a later one may use an earlier one's).
_LIBRARIES = ("_lib.lua", "_budget.lua")

_DEFINITION = re.compile(r"local\s+(?:function\s+)?([\w\s,]+?)\s*(?:=|\(|--|$)")
_NAME = re.compile(r"[A-Za-z_]\w*")
_COMMENT = re.compile(r"--\[\[.*?\]\]|--[^\n]*", re.DOTALL)
_HEADER = re.compile(r"\A--\[\[.*?--\]\]\n", re.DOTALL)  # the library's own description
# A constant's declaration (with the comment lines above it): one name, one literal, an
# optional comment, nothing else.
_CONSTANT = re.compile(
    r"^(?:--[^\n]*\n)*local ([A-Z][A-Z0-9_]*) = "
    r"(-?\d+(?:\.\d+)?(?:e-?\d+)?|'[^'\\\n]*')[ \t]*(?:--[^\n]*)?\n",
    re.MULTILINE,
)
# What a name could be mistaken for: comments, strings, names after '.' or ':' (fields).
_TOKEN = re.compile(
    r"--\[\[.*?\]\]|--[^\n]*|'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"|[.:]?[A-Za-z_]\w*",
    re.DOTALL,
)


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


def inline_constants(lib: str, *bodies: str) -> list[str]:
    """``lib`` without its constants' declarations, then each body: their uses made literals."""
    constants = {
        name: f"({value})" if value.startswith("-") else value  # no '--' after a '-'
        for name, value in _CONSTANT.findall(lib)
    }

    def literal(token: re.Match[str]) -> str:
        return constants.get(token[0], token[0])

    return [_TOKEN.sub(literal, text) for text in (_CONSTANT.sub("", lib), *bodies)]


@functools.cache
def script_sources() -> dict[str, str]:
    folder = resources.files(__package__) / "lua"
    libraries = (_HEADER.sub("", (folder / name).read_text("utf-8")) for name in _LIBRARIES)
    lib, *bodies = inline_constants(
        "\n".join(libraries),
        *((folder / f"{name}.lua").read_text("utf-8") for name in SCRIPTS),
    )
    return {name: shake(lib, body) for name, body in zip(SCRIPTS, bodies, strict=True)}
