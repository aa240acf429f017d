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

The same sources also make one Redis Functions library (``function_library``), loaded once
per server and called with FCALL: its top-level code, the definitions, runs once at FUNCTION
LOAD, so a call pays no closures at all. ``redis_clients`` says when each is used.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from importlib import resources

from .redis_codec import CODECS

__all__ = [
    "SCRIPTS",
    "FunctionLibrary",
    "function_library",
    "inline_constants",
    "script_sources",
    "shake",
]

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
    return "\n".join([*_needed(lib, body), body])


def _needed(lib: str, body: str) -> list[str]:
    """The definitions of ``lib`` that ``body`` uses, directly or through others, in order."""
    needed = _names(body)
    kept = []
    for names, text in reversed(_definitions(lib)):  # a definition only uses earlier ones
        if names & needed:
            kept.append(text)
            needed |= _names(text)
    return kept[::-1]


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
    """Each operation's EVALSHA script: the library definitions it uses, then its body."""
    lib, bodies = _sources()
    return {name: _global_math(shake(lib, body)) for name, body in bodies.items()}


def _global_math(script: str) -> str:
    """The script with ``math.floor`` ... where the library has its locals ``math_floor`` ...: a
    script makes its closures on every call, and each local they capture costs more there
    (some 6,000 of a record's 188,000 instructions) than the lookups it saves."""
    return _MATH_CALL.sub(r"math.\1(", script.replace(_MATH_ALIASES, ""))


@functools.cache
def _sources() -> tuple[str, dict[str, str]]:
    """The libraries (constants inlined) and each operation's body (constants inlined)."""
    folder = resources.files(__package__) / "lua"
    libraries = (_HEADER.sub("", (folder / name).read_text("utf-8")) for name in _LIBRARIES)
    lib, *bodies = inline_constants(
        "\n".join(libraries),
        *((folder / f"{name}.lua").read_text("utf-8") for name in SCRIPTS),
    )
    return lib, dict(zip(SCRIPTS, bodies, strict=True))


@dataclass(frozen=True, slots=True)
class FunctionLibrary:
    """The operations as one Redis Functions library: FUNCTION LOAD ``code``, then
    ``FCALL <functions[op]> 1 <key> <args>``."""

    name: str  # tokenfuse_<hash of the sources>
    code: str
    functions: dict[str, str]  # operation -> its function's name


#: Operations that write nothing: flagged ``no-writes``, so that they still answer, as their
#: EVALSHA scripts do, on a server out of memory (Redis refuses any other function then,
#: before it runs) or on a read-only replica.
_READ_ONLY = frozenset({"gate", "status", "run_read"})

# The library's top-level code picks struct.pack when the server has it (Redis has, fakeredis
# not). While a library loads, Redis hides the struct global (reading it is an error): the
# functions library takes the plain-Lua fallback there and binds struct at its first call.
_STRUCT_TEST = "if struct then\n"
_BIND_STRUCT = """
local bound = false -- whether struct is bound: not at FUNCTION LOAD, where it is out of reach
local function bind_struct() -- (a server without struct, as fakeredis, errors on reading it)
  bound = true
  math_floor, math_ceil, math_max, math_min, math_exp =
    math.floor, math.ceil, math.max, math.min, math.exp
  local found, library = pcall(function() return struct end)
  if found and library then pack, unpack_doubles = library.pack, library.unpack end
end
"""


# The library's local aliases of math functions: math, too, is out of reach while a library
# loads, so the function library declares them unbound and bind_struct binds them; the
# EVALSHA scripts call math's own (_global_math).
_MATH_ALIASES = (
    "local math_floor, math_ceil, math_max, math_min, math_exp =\n"
    "  math.floor, math.ceil, math.max, math.min, math.exp\n"
)
_MATH_UNBOUND = "local math_floor, math_ceil, math_max, math_min, math_exp -- bind_struct, below\n"
_MATH_CALL = re.compile(r"\bmath_(floor|ceil|max|min|exp)\(")


# A script's KEYS and ARGV are globals, which a few library definitions read too; a function
# gets them as its arguments: each call sets these, which the definitions and body capture.
_CALL_ARGUMENTS = "local KEYS, ARGV -- this call's keys and arguments\n"


@functools.cache
def function_library() -> FunctionLibrary:
    """Every operation in one library, named after a hash of the sources: a server shared by
    two tokenfuse versions holds both libraries, whose function names (global in Redis) do
    not clash."""
    lib, bodies = _sources()
    definitions = "\n".join(_needed(lib, "\n".join(bodies.values())))
    if _STRUCT_TEST not in definitions:
        raise AssertionError("the library no longer picks struct.pack with 'if struct then'")
    definitions = definitions.replace(_STRUCT_TEST, "if false then -- bind_struct, below\n", 1)
    if _MATH_ALIASES not in definitions:
        raise AssertionError("the library no longer binds its math aliases as _MATH_ALIASES says")
    definitions = definitions.replace(_MATH_ALIASES, _MATH_UNBOUND, 1)
    placeholder = "tokenfuse_@"  # the name, until the hash of the code it names is known
    functions = {op: f"{placeholder}_{op}" for op in bodies}
    registrations = [
        _registration(functions[op], op in _READ_ONLY, body) for op, body in bodies.items()
    ]
    code = "\n".join([_CALL_ARGUMENTS, definitions, _BIND_STRUCT, *registrations])
    name = f"tokenfuse_{hashlib.sha1(code.encode()).hexdigest()[:12]}"
    code = f"#!lua name={name}\n" + code.replace(placeholder, name)
    functions = {op: function.replace(placeholder, name) for op, function in functions.items()}
    return FunctionLibrary(name, code, functions)


def _registration(function: str, read_only: bool, body: str) -> str:
    """The body, unchanged, as the function ``function`` (KEYS and ARGV: ``_CALL_ARGUMENTS``)."""
    flags = "{'no-writes'}" if read_only else "{}"
    return (
        f"redis.register_function{{function_name = '{function}', flags = {flags}, "
        "callback = function(keys, args)\n"
        "KEYS, ARGV = keys, args\n"
        "if not bound then bind_struct() end\n"
        f"{body}\nend}}"
    )
