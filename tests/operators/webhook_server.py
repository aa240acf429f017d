"""A real HTTP server on loopback that receives webhook POSTs, answering as a test scripts it."""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    """What the server saw: each request's JSON body, in order, on a queue."""

    def __init__(self) -> None:
        self.bodies: queue.Queue[dict[str, Any]] = queue.Queue()
        self.statuses: list[int] = []  # answered in order; 200 once they run out
        self.hold = threading.Event()  # while clear, requests wait (a hung receiver)
        self.hold.set()
        self.url = ""

    def next(self, timeout: float = 10.0) -> dict[str, Any]:
        return self.bodies.get(timeout=timeout)

    def count(self) -> int:
        return self.bodies.qsize()


@contextmanager
def webhook_receiver() -> Iterator[Receiver]:
    receiver = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            receiver.bodies.put(json.loads(body))
            receiver.hold.wait(30)
            status = receiver.statuses.pop(0) if receiver.statuses else 200
            self.send_response(status)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    try:
        yield receiver
    finally:
        receiver.hold.set()
        server.shutdown()
        server.server_close()
        thread.join(5)
