"""Configuration without code: ``configure`` and the ``TOKENFUSE_*`` environment variables.

>>> from tokenfuse.config import VARIABLES
>>> [variable.env for variable in VARIABLES][:2]
['TOKENFUSE_REDIS_URL', 'TOKENFUSE_REDIS_PREFIX']

``docs/configuration.md`` describes each variable.
"""

# This module is the public face of _settings: the names it exports, no more.
from ._settings import *  # noqa: F403
from ._settings import __all__ as __all__
