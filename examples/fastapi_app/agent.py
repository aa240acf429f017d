"""A looping agent: calls the same tools with the same arguments as fast as it can.

    python examples/fastapi_app/agent.py                   # 10 s against http://127.0.0.1:8000
    python examples/fastapi_app/agent.py --seconds 3 --url http://127.0.0.1:8001

Within a second its bucket is empty (429 quota_exhausted: it may go on at the refill rate);
after 60 calls in a minute the velocity ceiling latches it out for 60 s (429 manual_ceiling;
120 s when it trips again within the hour, as a rerun does).
It prints the first call of each outcome per tool, the first refusal of each type in full
(headers and JSON body), a line per second, and a summary. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.error
import urllib.request
from collections import Counter

TOOLS = [
    ("/tools/refund", {"charge_id": "ch_3PzY", "amount_cents": 4_200}),
    ("/tools/crm/contacts", {"email": "ada@example.com", "name": "Ada"}),
]
SHOWN = ("retry-after", "ratelimit-policy", "ratelimit")


def call(url: str, key: str, path: str, payload: object) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(
        url + path,
        data=json.dumps(payload).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, b""
    except urllib.error.HTTPError as error:
        return error.code, {k.lower(): v for k, v in error.headers.items()}, error.read()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--key", default="sk-agent-demo-7f3a9c21")
    args = parser.parse_args()

    outcomes: Counter[str] = Counter()
    second: Counter[str] = Counter()
    seen: set[tuple[str, str]] = set()
    started = time.monotonic()
    tick = 1.0
    n = 0
    while (elapsed := time.monotonic() - started) < args.seconds:
        if elapsed >= tick:
            print(f"  second {tick:3.0f}: " + ", ".join(f"{c} x {o}" for o, c in second.items()))
            second.clear()
            tick += 1.0
        path, payload = TOOLS[n % len(TOOLS)]
        n += 1
        status, headers, body = call(args.url, args.key, path, payload)
        outcome = str(status) if status != 429 else f"429 {json.loads(body)['type']}"
        outcomes[outcome] += 1
        second[outcome] += 1
        if (path, outcome) not in seen:
            seen.add((path, outcome))
            print(f"call {n:5d} {path:20s} -> {outcome:22s} RateLimit: {headers.get('ratelimit')}")
            if status == 429 and outcomes[outcome] == 1:
                for name in SHOWN:
                    print(f"    {name}: {headers.get(name)}")
                shown = json.dumps(json.loads(body), indent=2, ensure_ascii=False)
                print("    " + shown.replace("\n", "\n    "))
    print(
        f"summary of {n} calls in {args.seconds:g} s:",
        ", ".join(f"{count} x {outcome}" for outcome, count in outcomes.items()),
    )


if __name__ == "__main__":
    main()
