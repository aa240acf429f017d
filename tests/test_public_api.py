"""The public face: a curated, sorted, complete ``__all__`` (as httpx keeps its own)."""

from __future__ import annotations

from types import ModuleType

import tokenfuse


def test_all_is_sorted_and_importable() -> None:
    assert tokenfuse.__all__ == sorted(tokenfuse.__all__, key=lambda n: (not n.isupper(), n))
    for name in tokenfuse.__all__:
        assert getattr(tokenfuse, name) is not None


def test_every_public_name_is_listed() -> None:
    # Subpackages (tokenfuse.integrations, once imported) are modules, not names of __all__.
    public = {
        name
        for name in dir(tokenfuse)
        if not name.startswith("_") and not isinstance(getattr(tokenfuse, name), ModuleType)
    }
    assert public - {"TYPE_CHECKING"} <= set(tokenfuse.__all__)


def test_exceptions_share_one_root() -> None:
    for name in ("LoopSuspected", "CeilingExceeded", "QuotaExhausted", "StoreUnavailable",
                 "ConfigurationError", "FuseTripped"):  # fmt: skip
        assert issubclass(getattr(tokenfuse, name), tokenfuse.TokenFuseError)
