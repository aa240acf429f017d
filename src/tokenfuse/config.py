"""Configuration without code: ``configure`` and the ``TOKENFUSE_*`` environment variables.

>>> from tokenfuse.config import VARIABLES
>>> [variable.env for variable in VARIABLES][:2]
['TOKENFUSE_REDIS_URL', 'TOKENFUSE_REDIS_PREFIX']

``docs/configuration.md`` describes each variable.
"""

from ._settings import (
    VARIABLES,
    Settings,
    Variable,
    configure,
    current,
    default_fuses,
    duration,
    reload,
)

__all__ = [
    "VARIABLES",
    "Settings",
    "Variable",
    "configure",
    "current",
    "default_fuses",
    "duration",
    "reload",
]
