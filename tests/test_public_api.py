"""The public face in layers: everyday names at the top, one module per extension point.

Each public module keeps a curated, sorted, complete ``__all__`` (as httpx keeps its own), and
every type that a public constructor or function takes or returns can be imported from one.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import pydoc
import re
import subprocess
import sys
import types
from collections.abc import Iterator, Mapping

import pytest

import tokenfuse

PUBLIC_MODULES = {
    name: importlib.import_module(f"tokenfuse.{name}")
    for name in sorted(m.name for m in pkgutil.iter_modules(tokenfuse.__path__))
    if not name.startswith("_")
}
EVERY_MODULE = {"tokenfuse": tokenfuse} | {f"tokenfuse.{n}": m for n, m in PUBLIC_MODULES.items()}
EXPORTED = {id(getattr(m, name)) for m in EVERY_MODULE.values() for name in m.__all__}


def test_the_public_modules() -> None:
    assert set(PUBLIC_MODULES) == {
        "admin",
        "alerts",
        "config",
        "events",
        "fuse",
        "guards",
        "integrations",
        "mcp",
        "metrics",
        "middleware",
        "replay",
        "stores",
        "transport",
        "usage",
    }


def test_the_top_level_is_a_short_list() -> None:
    assert len(tokenfuse.__all__) <= 25


@pytest.mark.parametrize("name", EVERY_MODULE)
def test_all_is_sorted_and_importable(name: str) -> None:
    module = EVERY_MODULE[name]
    assert module.__all__ == sorted(module.__all__, key=lambda n: (not n.isupper(), n))
    for public in module.__all__:
        assert getattr(module, public) is not None


@pytest.mark.parametrize("name", EVERY_MODULE)
def test_every_public_name_is_listed(name: str) -> None:
    module = EVERY_MODULE[name]
    public = {
        attr
        for attr, value in vars(module).items()
        if not attr.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public - {"annotations", "TYPE_CHECKING"} <= set(module.__all__)


def test_redis_store_is_imported_only_when_asked_for() -> None:
    # Without the optional redis package installed, `import tokenfuse` must still work.
    code = "import sys, tokenfuse, tokenfuse.stores; print('redis' in sys.modules)"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert found.stdout.strip() == "False", found.stderr
    assert tokenfuse.RedisStore is PUBLIC_MODULES["stores"].RedisStore


# The top level before the API was layered (42 names): each one still imports from it.
OLD_TOP_LEVEL = [
    "CALL_VELOCITY", "FREE", "GROWTH", "STARTER", "AsyncFuseTransport", "BucketPolicy",
    "CeilingExceeded", "ConfigurationError", "Decision", "Fuse", "FuseEvent", "FuseReport",
    "FuseTransport", "FuseTripped", "Identity", "LoopSuspected", "MemoryStore", "QuotaExhausted",
    "RedisStore", "Reply", "RequestView", "ShapeExtractor", "Status", "StoreUnavailable",
    "TokenFuse", "TokenFuseError", "TokenFuseWSGI", "Usage", "UsageShape", "VelocityPolicy",
    "__version__", "bearer_or_api_key", "by_header", "current_scope", "default_fuse",
    "default_inbound_fuse", "default_registry", "find_refusal", "inbound_fuse", "report_tokens",
    "scope", "unwrap_refusals",
]  # fmt: skip


@pytest.mark.parametrize("name", OLD_TOP_LEVEL)
def test_every_old_top_level_name_still_imports(name: str) -> None:
    assert getattr(tokenfuse, name) is not None


@pytest.mark.parametrize(("name", "module"), tokenfuse._ELSEWHERE.items())
def test_a_name_served_from_a_submodule_is_the_one_listed_there(name: str, module: str) -> None:
    public = PUBLIC_MODULES[module]
    assert name in public.__all__
    assert getattr(tokenfuse, name) is getattr(public, name)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Fuze'"):
        tokenfuse.Fuze  # noqa: B018


def test_exceptions_share_one_root() -> None:
    for name in ("LoopSuspected", "CeilingExceeded", "QuotaExhausted", "StoreUnavailable",
                 "ConfigurationError", "FuseTripped", "BudgetExceeded"):  # fmt: skip
        assert issubclass(getattr(tokenfuse, name), tokenfuse.TokenFuseError)


# -- every type a public signature names is public too ----------------------------------------


_ALIASES = (str, types.GenericAlias, types.UnionType)  # a string alias, Callable[...], A | B


def _types_named(text: str, namespace: Mapping[str, object], seen: set[str]) -> Iterator[type]:
    """The tokenfuse classes an annotation names, through type aliases (``Who``, ``Cost``)."""
    for word in set(re.findall(r"[A-Za-z_][\w.]*", text)) - seen:
        seen.add(word)
        value = pydoc.locate(word) if "." in word else namespace.get(word)
        if isinstance(value, type) and value.__module__.startswith("tokenfuse"):
            yield value
        elif isinstance(value, _ALIASES) or type(value).__module__ == "typing":
            yield from _types_named(str(value), namespace, seen)


def _signature_types(obj: object) -> Iterator[type]:
    module = inspect.getmodule(obj)
    namespace = vars(module) if module is not None else {}
    try:
        signature = inspect.signature(obj)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return
    annotations = [p.annotation for p in signature.parameters.values()]
    annotations.append(signature.return_annotation)
    seen: set[str] = set()
    for annotation in annotations:
        if isinstance(annotation, str):
            yield from _types_named(annotation, namespace, seen)


def _private_protocol(cls: type) -> bool:
    # Structural types such as "an httpx transport": the caller passes its own object.
    return cls.__name__.startswith("_") and getattr(cls, "_is_protocol", False)


@pytest.mark.parametrize("name", EVERY_MODULE)
def test_what_public_signatures_take_and_return_is_public(name: str) -> None:
    module = EVERY_MODULE[name]
    missing = set()
    for public in module.__all__:
        obj = getattr(module, public)
        if not callable(obj):
            continue
        for cls in _signature_types(obj):
            if id(cls) not in EXPORTED and not _private_protocol(cls):
                missing.add(f"{public} -> {cls.__module__}.{cls.__qualname__}")
    assert not missing, sorted(missing)
