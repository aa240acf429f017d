"""What every framework helper shares: importing the framework lazily and saying clearly why a
framework cannot be guarded (not installed, or a version that moved the seam)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from importlib import metadata
from types import ModuleType
from typing import Any, TypeAlias

from .. import ConfigurationError, Identity

__all__ = ["Key", "load", "seam_moved", "version_of"]

#: Who the guarded calls are counted for, as ``FuseTransport(key=...)`` takes it: a name, an
#: ``Identity``, a callable of the request, or None for the credential each request carries.
Key: TypeAlias = "str | Identity | Callable[[Any], str | Identity | None] | None"


def load(module: str, *, extra: str) -> ModuleType:
    """Import ``module``, or say which tokenfuse extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigurationError(
            f"{module} is not installed: pip install 'tokenfuse[{extra}]'"
        ) from exc


def version_of(distribution: str) -> str:
    """The installed version of ``distribution``, for error messages (``?`` when unknown)."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "?"


def seam_moved(distribution: str, supported: str, what: str) -> ConfigurationError:
    """The error for a framework version whose hook tokenfuse relies on is gone or changed."""
    return ConfigurationError(
        f"{distribution} {version_of(distribution)} moved {what}, which tokenfuse uses to guard "
        f"it; tokenfuse.integrations supports {distribution} {supported}. Guard its HTTP client "
        "yourself with FuseTransport/AsyncFuseTransport, or install a supported version."
    )
