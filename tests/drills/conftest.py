"""The drills use the store tests' redis-server of their own (``own_redis``)."""

from tests.stores.conftest import own_redis

__all__ = ["own_redis"]
