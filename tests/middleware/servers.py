"""Real server processes for the smoke tests: started on a free loopback port, stopped by PID."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child process: this one's, minus any ``TOKENFUSE_*`` setting (a
    caller's ``TOKENFUSE_REDIS_URL`` must not move an example onto Redis), plus ``env``."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("TOKENFUSE_")}
    return {**inherited, "PYTHONUNBUFFERED": "1", **(env or {})}


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), 0.2):
            return True
    except OSError:
        return False


@contextmanager
def running(
    args: list[str],
    port: int,
    env: Mapping[str, str] | None = None,
    timeout: float = 20.0,
    python: str = sys.executable,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``python <args>`` with ``child_env(env)`` until the block ends; only this process
    is ever signalled."""
    log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in the finally below
    process = subprocess.Popen(
        [python, *args],
        cwd=ROOT,
        env=child_env(env),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + timeout
        while not _answers(port):
            if process.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                output = log.read().decode(errors="replace")
                raise RuntimeError(f"server {args} did not start on {port}:\n{output}")
            time.sleep(0.05)  # polling for readiness, not timing anything
        yield process
    finally:
        if process.poll() is None:
            process.terminate()  # this PID only
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        log.close()
