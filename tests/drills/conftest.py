"""The drills use the store tests' fixtures: a key prefix of their own, a redis-server of
their own."""

from tests.stores.conftest import own_redis, prefix

__all__ = ["own_redis", "prefix"]
