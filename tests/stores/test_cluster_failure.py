"""Drill: one primary of a replica-less Redis Cluster dies; the keys on the others stay guarded.

Starts a private 3-node cluster (``scripts/redis-cluster.sh``, ports 7400-7402, or the three
from ``TOKENFUSE_DRILL_PORT``) and kills one primary by the PID in its pidfile; the others
lose their function library then, and load it again. Two things used to stop enforcement for
every key:

* the server: with ``cluster-require-full-coverage yes`` (Redis's default) the live nodes
  answer CLUSTERDOWN for *every* key once the dead one is flagged FAIL (about 4 s with the
  script's 2 s node timeout);
* the fuse: with a third of the keys failing, three failures in a row come by chance every
  few dozen decisions, and the back-off then skipped the whole store.

Decisions are made on identities of every node in a random (seeded) order, after the
cluster has flagged the dead node, on both faces of one store.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster

from tests.middleware.servers import ROOT, _answers
from tokenfuse import Fuse, FuseEvent, VelocityPolicy
from tokenfuse._identity import Identity
from tokenfuse._stores.redis import RedisStore
from tokenfuse._stores.redis_codec import key_of

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server"),
]

FIRST_PORT = int(os.environ.get("TOKENFUSE_DRILL_PORT", "7400"))  # and the next two
PORTS = (FIRST_PORT, FIRST_PORT + 1, FIRST_PORT + 2)
PREFIX = "tf-drill"
CEILING = VelocityPolicy(limit=100)


def _script(action: str, workdir: Path) -> None:
    env = {**os.environ, "TOKENFUSE_CLUSTER_PORT": str(FIRST_PORT)}
    command = ["bash", str(ROOT / "scripts" / "redis-cluster.sh"), action, str(workdir)]
    subprocess.run(command, env=env, check=True, capture_output=True, timeout=60)


@pytest.fixture
def private_cluster(tmp_path: Path) -> Iterator[Path]:
    if any(_answers(port) for port in PORTS):
        message = f"ports {PORTS} are taken: the drill starts a cluster of its own there"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    workdir = tmp_path / "cluster"
    _script("start", workdir)
    try:
        yield workdir
    finally:
        _script("stop", workdir)  # only the PIDs in its pidfiles


def _flagged_failed(port: int, victim: int) -> bool:
    nodes = subprocess.run(
        ["redis-cli", "-p", str(port), "cluster", "nodes"], capture_output=True, text=True
    ).stdout
    return any(f":{victim}@" in line and " fail" in line.replace(",", " ") for line in
               nodes.splitlines())  # fmt: skip


def kill_primary(workdir: Path, victim: int) -> None:
    pid = int((workdir / str(victim) / "redis.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    live = next(port for port in PORTS if port != victim)
    for _ in range(200):  # waiting for the cluster's own failure detection, not timing it
        if _flagged_failed(live, victim):
            return
        time.sleep(0.05)
    raise AssertionError(f"the cluster never flagged :{victim} as failed")


def identities_by_port(fuse: Fuse) -> dict[int, list[str]]:
    client = RedisCluster(host="127.0.0.1", port=FIRST_PORT)
    by_port: dict[int, list[str]] = {port: [] for port in PORTS}
    for n in range(90):
        who = f"agent-{n}"
        name = key_of(PREFIX, fuse._key(Identity.of(who)))
        by_port[int(client.get_node_from_key(name).port)].append(who)
    client.close()
    assert all(by_port.values())
    return by_port


async def test_keys_on_live_nodes_keep_being_enforced(private_cluster: Path) -> None:
    events: list[FuseEvent] = []
    store = RedisStore.from_url(f"redis+cluster://127.0.0.1:{FIRST_PORT}", prefix=PREFIX)
    fuse = Fuse(store, velocity=CEILING, on_event=events.append)
    by_port = identities_by_port(fuse)
    victim = PORTS[1]  # not the node of the URL: a new client must still find the cluster
    for who in (who for group in by_port.values() for who in group):
        assert fuse.record(who, 1).allowed and not (await fuse.arecord(who, 1)).degraded

    kill_primary(private_cluster, victim)
    for port in PORTS:  # each live node must load the library again while one primary is dead
        if port != victim:
            with redis.Redis(port=port) as node:
                node.function_flush()
    on_live = {who for port, group in by_port.items() if port != victim for who in group}
    everyone = sorted(who for group in by_port.values() for who in group)
    rng = random.Random(8)
    outcomes: dict[str, list[bool]] = {"live": [], "dead": []}
    for n in range(300):
        who = rng.choice(everyone)
        decision = fuse.record(who, 1) if n % 2 else await fuse.arecord(who, 1)
        outcomes["live" if who in on_live else "dead"].append(decision.degraded)

    for side, degraded in outcomes.items():  # -rP
        print(f"{side}-node keys: {sum(degraded)} of {len(degraded)} decisions failed open")
    assert not any(outcomes["live"]), f"{sum(outcomes['live'])} live-node decisions failed open"
    assert all(outcomes["dead"])  # its keys cannot be read: fail open, counted
    assert fuse.health.counts.skipped == 0
    assert fuse.health.counts.failed == len(outcomes["dead"])
    # Still enforcing, not merely answering: a live key over its ceiling trips.
    tripping = sorted(on_live)[0]
    trip = fuse.record(tripping, 150)
    assert trip.tripped, (trip, fuse.health.counts)
    # The library was loaded on this node again after its flush, not on every primary (which
    # the dead one would refuse); the gate's function runs there.
    assert not (await fuse.agate(tripping)).allowed
    assert [e.kind for e in events].count("store_recovered") <= 1
    await store.aclose()
