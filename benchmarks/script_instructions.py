"""Instructions Redis spends on one decision, by callgrind: repeatable on a loaded machine.

    python benchmarks/script_instructions.py [--calls 300]

Starts a private ``redis-server`` under ``valgrind --tool=callgrind`` (on a Unix socket of a
temporary folder, never the shared server), and for each case warms up, zeroes the counters,
makes ``--calls`` calls and reads the server's instructions back: what the server does per
call (parsing the request, the script, its commands, its garbage), not the client or the wire.
The reference rows are what any decision pays (``PING``, ``EVALSHA`` of an empty script) and
``limits``' sliding-window script; ``library only`` is the record script with its body cut
to ``return 1``: the cost of making the closures of the library functions it carries, which
Redis pays on every ``EVALSHA``. Needs valgrind and redis-server.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable

import redis
from limits import parse, storage, strategies

from tokenfuse import BucketPolicy, VelocityPolicy
from tokenfuse._middleware import CALL_VELOCITY
from tokenfuse._stores.ops import Admit, Gate, Record
from tokenfuse._stores.redis import RedisStore
from tokenfuse._stores.redis_codec import CODECS
from tokenfuse._stores.redis_scripts import script_sources

POLICY = VelocityPolicy(cold_start_limit=None)
BUCKET = BucketPolicy(rate=1e9, capacity=1e9)  # bench_middleware.py's


def start_server(folder: str) -> tuple[subprocess.Popen[bytes], str]:
    socket = os.path.join(folder, "redis.sock")
    server = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={folder}/out.%p",
         "redis-server", "--port", "0", "--unixsocket", socket, "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    client = redis.Redis(unix_socket_path=socket)
    for _ in range(600):  # valgrind starts slowly on a loaded machine
        try:
            client.ping()
            return server, socket
        except redis.ConnectionError:
            time.sleep(0.1)
    server.kill()
    raise RuntimeError("redis-server under callgrind did not answer")


def instructions(pid: int, folder: str, calls: int, case: Callable[[], object]) -> float:
    """Server instructions per call of ``case``: counters zeroed, ``calls`` made, dumped."""
    for _ in range(50):
        case()
    subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)
    for _ in range(calls):
        case()
    subprocess.run(["callgrind_control", "-d", str(pid)], check=True, capture_output=True)
    for _ in range(600):
        dumps = glob.glob(f"{folder}/out.{pid}.*")
        if dumps:
            break
        time.sleep(0.1)
    time.sleep(0.5)  # the dump is written, not yet complete
    (dump,) = dumps
    with open(dump) as text:
        total = next(int(line.split()[1]) for line in text if line.startswith("summary:"))
    os.remove(dump)
    return total / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="tokenfuse-callgrind-")
    server, socket = start_server(folder)
    try:
        client = redis.Redis(unix_socket_path=socket)
        clock = [1_767_225_600.0]

        def tick() -> float:  # a record every 13 ms: slots and minutes roll as in traffic
            clock[0] += 0.013
            return clock[0]

        store = RedisStore(client, prefix="cg", open_keys=False, clock=tick)
        sliding = strategies.SlidingWindowCounterRateLimiter(
            storage.RedisStorage(f"unix://{socket}")
        )
        item = parse("1000000000/minute")
        empty = client.register_script("return 1")
        record = script_sources()["record"]
        library = client.register_script(record[: record.index("local now = clock(")] + "return 1")
        record_args = CODECS[Record].args(Record("k", 10, POLICY), repr(tick()), "1000000")
        cases: dict[str, Callable[[], object]] = {
            "PING": client.ping,
            "EVALSHA of 'return 1'": lambda: empty(keys=["cg:{empty}"]),
            "limits sliding-window hit": lambda: sliding.hit(item, "cg", "k"),
            "record script, library only": lambda: library(keys=["cg:{lib}"], args=record_args),
            "Record": lambda: store.run(Record("k", 10, POLICY)),
            "Admit (bucket and velocity)": lambda: store.run(
                Admit("a", cost=1, amount=1, velocity=CALL_VELOCITY, bucket=BUCKET)
            ),
            "Gate (a round trip)": lambda: store.run(Gate("k")),
        }
        print(f"| case | server instructions per call ({args.calls} calls) |")
        print("|---|---:|")
        for name, case in cases.items():
            print(f"| {name} | {instructions(server.pid, folder, args.calls, case):,.0f} |")
        client.close()
    finally:
        server.terminate()
        server.wait(timeout=60)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
