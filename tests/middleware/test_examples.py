"""The examples run as documented: real servers (uvicorn, Flask's) on free loopback ports, the
agent script against them. Every process started here is stopped by its own PID, and sees no
``TOKENFUSE_*`` variable of the caller's environment: each test sets what it means."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from tests.middleware.servers import ROOT, child_env, free_port, running

EXAMPLES = {
    "fastapi": ("examples/fastapi_app/app.py", "examples/fastapi_app/agent.py"),
    "flask": ("examples/flask_app/app.py", "examples/flask_app/agent.py"),
}
KEY = "sk-agent-demo-7f3a9c21"


def get(
    url: str, key: str | None = None, method: str = "GET"
) -> tuple[int, dict[str, object], dict[str, str]]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps({"email": "ada@example.com", "name": "Ada"}).encode()
    request = urllib.request.Request(url, data=data if method == "POST" else None, headers=headers)
    request.method = method
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()), dict(error.headers)


def agent(name: str, port: int, seconds: float) -> str:
    done = subprocess.run(
        [sys.executable, EXAMPLES[name][1], "--url", f"http://127.0.0.1:{port}",
         "--seconds", str(seconds)],
        cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_the_example_serves_and_the_agent_sees_429s(name: str) -> None:
    port = free_port()
    with running([EXAMPLES[name][0]], port, {"PORT": str(port)}):
        health = get(f"http://127.0.0.1:{port}/health")
        assert health[:2] == (200, {"status": "ok", "store": "memory"})
        assert "RateLimit" not in health[2]  # excluded

        output = agent(name, port, 1.5)

    assert "-> 200" in output
    assert "-> 429 quota_exhausted" in output
    assert '"type": "quota_exhausted"' in output
    assert 'ratelimit-policy: "default";q=50;w=5' in output
    assert "summary of" in output


@pytest.mark.slow
@pytest.mark.redis
def test_both_examples_on_one_redis_contain_an_agent_together(redis_url: str, prefix: str) -> None:
    env = {"TOKENFUSE_REDIS_URL": redis_url, "TOKENFUSE_REDIS_PREFIX": prefix}
    fastapi_port, flask_port = free_port(), free_port()

    with (
        running([EXAMPLES["fastapi"][0]], fastapi_port, {**env, "PORT": str(fastapi_port)}),
        running([EXAMPLES["flask"][0]], flask_port, {**env, "PORT": str(flask_port)}),
    ):
        assert get(f"http://127.0.0.1:{flask_port}/health")[1]["store"] == "redis"
        output = agent("fastapi", fastapi_port, 1.5)
        flask = f"http://127.0.0.1:{flask_port}/tools/crm/contacts"
        same_agent = get(flask, KEY, "POST")
        other_agent = get(flask, "sk-other-agent-0001", "POST")

    assert "-> 429 quota_exhausted" in output
    # The bucket the agent emptied through the FastAPI app is the one the Flask app sees.
    if same_agent[0] == 429:
        assert same_agent[1]["type"] in ("quota_exhausted", "manual_ceiling")
    else:
        remaining = int(same_agent[2]["RateLimit"].split(";r=")[1].split(";")[0])
        assert remaining < 10
    assert other_agent[0] == 200
    assert other_agent[2]["RateLimit"] == '"default";r=49;t=1'
