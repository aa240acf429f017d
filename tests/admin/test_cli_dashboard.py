"""``tokenfuse dashboard``: the admin app of the process's fuses, configured by environment."""

from __future__ import annotations

import uuid

import httpx
import pytest
import redis

from tests.middleware.servers import free_port, running
from tests.stores.conftest import delete_prefix

pytestmark = [pytest.mark.redis, pytest.mark.slow]

TOKEN = "cli-admin-token-0123456789"


def test_the_dashboard_command_serves_the_app_behind_its_token(redis_url: str) -> None:
    prefix = f"tf-cli-{uuid.uuid4().hex[:8]}"
    port = free_port()
    env = {
        "TOKENFUSE_REDIS_URL": redis_url,
        "TOKENFUSE_REDIS_PREFIX": prefix,
        "TOKENFUSE_ADMIN_TOKEN": TOKEN,
    }
    try:
        with running(["-m", "tokenfuse", "dashboard", "--port", str(port)], port, env=env):
            url = f"http://127.0.0.1:{port}"
            assert httpx.get(f"{url}/api/keys", timeout=10).status_code == 401
            answer = httpx.get(
                f"{url}/api/info", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
            )
            assert answer.status_code == 200
            assert answer.json()["fuse"] == "default"
            assert prefix in answer.json()["store"]
    finally:
        with redis.Redis.from_url(redis_url) as raw:
            delete_prefix(raw, prefix)
