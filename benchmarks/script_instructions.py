"""Instructions Redis spends on one decision, by callgrind: repeatable on a loaded machine.

    python benchmarks/script_instructions.py [--calls 300] [--client]

Starts a private ``redis-server`` under ``valgrind --tool=callgrind`` (on a Unix socket of a
temporary folder, never the shared server), and for each case warms up, zeroes the counters,
makes ``--calls`` calls and reads the server's instructions back: what the server does per
call (parsing the request, the script, its commands, its garbage), not the client or the wire.
The reference rows are what any decision pays (``PING``; ``EVALSHA`` of an empty script and
``FCALL`` of an empty function) and ``limits``' sliding-window script; ``library only`` is
the record operation with its body cut to ``return 1``: as an ``EVALSHA`` script, against an
empty script given the same arguments, the cost of making the closures of the library
functions it carries, which Redis pays on every ``EVALSHA``; as a function of tokenfuse's
library (``FCALL``), what is left of it (the library is built once, at FUNCTION LOAD). The
decisions are measured both ways: ``FCALL`` (what a ``RedisStore`` sends) and ``EVALSHA`` (its
fallback where the server runs no functions).
``--client`` counts the other side instead: this script's own instructions per call (redis-py,
tokenfuse, ``limits``), each case run twice under callgrind. Needs valgrind and redis-server.
"""

from __future__ import annotations

import argparse
import glob
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import redis
from limits import parse, storage, strategies

from tokenfuse import BucketPolicy, Fuse, VelocityPolicy
from tokenfuse._middleware import CALL_VELOCITY
from tokenfuse._stores.ops import Admit, Gate, Record
from tokenfuse._stores.redis import RedisStore
from tokenfuse._stores.redis_codec import CODECS
from tokenfuse._stores.redis_scripts import _registration, function_library, script_sources

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


def build_cases(socket: str) -> dict[str, Callable[[], object]]:
    client = redis.Redis(unix_socket_path=socket)
    clock = [1_767_225_600.0]

    def tick() -> float:  # a record every 13 ms: slots and minutes roll as in traffic
        clock[0] += 0.013
        return clock[0]

    store = RedisStore.from_url(f"unix://{socket}", prefix="cg", open_keys=False, clock=tick)
    scripts = evalsha_store(socket, tick)
    fuse = Fuse(store, velocity=POLICY, secret="benchmark-secret-of-32-characters")
    sliding = strategies.SlidingWindowCounterRateLimiter(storage.RedisStorage(f"unix://{socket}"))
    item = parse("1000000000/minute")
    empty = client.register_script("return 1")
    record = script_sources()["record"]
    library = client.register_script(record[: record.index("local now = clock(")] + "return 1")
    load_functions(client)
    record_args = CODECS[Record].args(Record("k", 10, POLICY), repr(tick()), "1000000")
    admit = Admit("a", cost=1, amount=1, velocity=CALL_VELOCITY, bucket=BUCKET)
    return {
        "PING": client.ping,
        "EVALSHA of 'return 1'": lambda: empty(keys=["cg:{empty}"]),
        "EVALSHA of 'return 1', the record's arguments": lambda: empty(
            keys=["cg:{empty}"], args=record_args
        ),
        "FCALL of 'return 1'": lambda: client.fcall("cg_empty", 1, "cg:{empty}"),
        "FCALL of 'return 1', the record's arguments": lambda: client.fcall(
            "cg_empty", 1, "cg:{empty}", *record_args
        ),
        "limits sliding-window hit": lambda: sliding.hit(item, "cg", "k"),
        "record script, library only (EVALSHA)": lambda: library(
            keys=["cg:{lib}"], args=record_args
        ),
        "record function, library only (FCALL)": lambda: client.fcall(
            "cg_library_only", 1, "cg:{lib}", *record_args
        ),
        "Record (EVALSHA)": lambda: scripts.run(Record("k", 10, POLICY)),
        "Record (FCALL)": lambda: store.run(Record("k", 10, POLICY)),
        "Fuse.record (FCALL)": lambda: fuse.record("agent", 10),
        "Admit, bucket and velocity (EVALSHA)": lambda: scripts.run(admit),
        "Admit, bucket and velocity (FCALL)": lambda: store.run(admit),
        "Gate, a round trip (EVALSHA)": lambda: scripts.run(Gate("k")),
        "Gate, a round trip (FCALL)": lambda: store.run(Gate("k")),
    }


def evalsha_store(socket: str, clock: Callable[[], float]) -> RedisStore:
    """A store moved to its EVALSHA scripts, as on a server that runs no functions."""
    store = RedisStore.from_url(f"unix://{socket}", prefix="cg", open_keys=False, clock=clock)
    store.run(Gate("k"))  # the sync client made
    server = store._clients._sync_server
    assert server is not None
    logging.getLogger("tokenfuse").disabled = True  # its warning is not news here
    server.fall_back(RuntimeError("measuring the EVALSHA path"))
    logging.getLogger("tokenfuse").disabled = False
    return store


def load_functions(client: redis.Redis) -> None:
    """The empty function, and tokenfuse's library with a function that is the record's
    with its body cut to ``return 1``."""
    empty = "#!lua name=cg_empty\nredis.register_function('cg_empty', function() return 1 end)"
    client.function_load(empty, replace=True)
    real = function_library()
    cut = _registration("cg_library_only", False, "return 1")
    client.function_load(real.code.replace(real.name, "cg_library") + "\n" + cut, replace=True)


def client_instructions(socket: str, folder: str, name: str, calls: int) -> float:
    """This script's own instructions per call of case ``name``, run under callgrind: two
    runs (20 and 20 + ``calls`` calls) and the difference, start-up and imports excluded."""
    totals = []
    for count in (20, 20 + calls):
        out = os.path.join(folder, "client.out")
        command = [sys.executable, __file__, "--socket", socket, "--case", name, "--calls"]
        subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *command, str(count)],
            check=True, capture_output=True,
        )  # fmt: skip
        with open(out) as text:
            totals.append(
                next(int(line.split()[1]) for line in text if line.startswith("summary:"))
            )
        os.remove(out)
    return (totals[1] - totals[0]) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--client", action="store_true", help="count the client's instructions")
    parser.add_argument("--socket", help=argparse.SUPPRESS)  # the client runs of --client
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:  # one client run of --client: warm up, then the calls, nothing else
        case = build_cases(args.socket)[args.case]
        for _ in range(30 + args.calls):
            case()
        os._exit(0)  # no teardown in the count
    folder = tempfile.mkdtemp(prefix="tokenfuse-callgrind-")
    server, socket = start_server(folder)
    try:
        side = "client" if args.client else "server"
        print(f"| case | {side} instructions per call ({args.calls} calls) |")
        print("|---|---:|")
        cases = build_cases(socket)
        for name, case in cases.items():
            if args.client:
                count = client_instructions(socket, folder, name, args.calls)
            else:
                count = instructions(server.pid, folder, args.calls, case)
            print(f"| {name} | {count:,.0f} |", flush=True)
    finally:
        server.terminate()
        server.wait(timeout=60)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
