"""The dashboard in a real browser: headless Chromium (Debian's ``chromium``, driven by
Playwright) loads the page of a real uvicorn server, against a real Redis, while this process
drives the traffic. It sees a key trip, clicks Reset, and sees the key close.

Keys learn a baseline first: three days of history are recorded on a simulated clock that ends
before the real one, so the table and the chart show real baselines and thresholds.

A screenshot of the tripped key goes to the test's output directory; with
``TOKENFUSE_DASHBOARD_SCREENSHOT=docs/dashboard.png`` also there
(``scripts/dashboard-screenshot.sh``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import redis

from tests.admin import admin_server as server_module
from tests.admin.conftest import SERVER_TOKEN
from tests.middleware.servers import ROOT
from tokenfuse import Fuse
from tokenfuse._identity import Identity

pytestmark = [pytest.mark.redis, pytest.mark.slow]

CHROMIUM = "/usr/bin/chromium"
#: Agents, their usual tokens per minute, and whether an operator gave them a limit (whose
#: event teaches the dashboard their label).
AGENTS = {
    "agent-research": (900, "12k/min"),
    "agent-support": (400, "6k/min"),
    "agent-billing": (250, None),
    "agent-loop": (300, "8k/min"),
    "<script>alert('label')</script>": (150, "3k/min"),
}


def chromium_or_skip() -> str:
    """Chromium's path; a skip, with the reason, only where it or Playwright truly is not
    there, and never in CI (``CI=true``), where .ci/run installs both."""
    found = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
    missing = [] if found else [f"no Chromium at {CHROMIUM} (apt-get install chromium)"]
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("no Playwright for Python (pip install playwright)")
    if missing and os.environ.get("CI"):
        pytest.fail("; ".join(missing) + ": .ci/run installs both")
    if missing or found is None:
        pytest.skip("; ".join(missing))
    return found


def learn_history(fuse_of_clock: Fuse, clock: list[float], now: float) -> None:
    """Three days of each agent's traffic on a simulated clock that stops 20 minutes before
    ``now``: enough learned minutes for every baseline to count."""
    clock[0] = now - 3 * 86_400 - 3 * 3_600
    for name, (per_minute, _) in AGENTS.items():
        fuse_of_clock.admit(name, amount=per_minute)  # first seen three days ago
    clock[0] = now - 90 * 60
    for _ in range(70):
        for name, (per_minute, _) in AGENTS.items():
            fuse_of_clock.admit(name, amount=per_minute)
        clock[0] += 60
    clock[0] = now - 20 * 60
    for name in AGENTS:
        fuse_of_clock.admit(name, amount=1)  # rolls the last full minute into the baseline


def test_a_key_trips_in_the_table_and_a_click_resets_it(
    admin_server: str, redis_url: str, tmp_path: Path
) -> None:
    chromium = chromium_or_skip()
    from playwright.sync_api import expect, sync_playwright

    with redis.Redis.from_url(redis_url) as raw:
        seconds, micros = raw.time()
    clock = [0.0]
    learn_history(server_module.fuse(clock=lambda: clock[0]), clock, seconds + micros / 1e6)
    fuse = server_module.fuse()  # the real clock from here on: the server's TIME
    for name, (_, limit) in AGENTS.items():
        if limit:
            fuse.set_limit(name, limit)
        fuse.admit(name, amount=AGENTS[name][0] * 0.9)
    loop_id = Identity.named("agent-loop").key_id
    dialogs: list[str] = []

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium)
        page = browser.new_page(viewport={"width": 1440, "height": 1000})
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        page.goto(f"{admin_server}/#token={SERVER_TOKEN}")
        row = page.locator(f'tr[data-key-id="{loop_id}"]')
        expect(row.locator(".state")).to_have_text("ok", timeout=15_000)
        assert "token=" not in page.url  # the token left the address bar for sessionStorage

        # The loop: many calls, each small, over ten times its baseline of 300 a minute.
        for _ in range(20):
            decision = fuse.admit("agent-loop", amount=250)
            if decision.tripped:
                break
        assert decision.tripped and decision.error is not None
        assert decision.error.reason == "loop_suspected"

        expect(row.locator(".state")).to_have_text("open", timeout=15_000)
        expect(page.locator("tbody tr").first).to_have_attribute("data-key-id", loop_id)
        expect(page.locator("#events .event.tripped").first).to_contain_text("agent-loop")
        row.locator(".key").click()
        expect(page.locator("#detail-title")).to_contain_text("agent-loop", timeout=10_000)
        expect(page.locator("#chart-window rect.column")).to_have_count(13)
        expect(page.locator("#chart-window .line.baseline")).to_have_count(1)
        page.screenshot(path=str(tmp_path / "dashboard-tripped.png"), full_page=True)
        wanted = os.environ.get("TOKENFUSE_DASHBOARD_SCREENSHOT")
        if wanted:
            shutil.copy(tmp_path / "dashboard-tripped.png", ROOT / wanted)

        row.locator("button.reset").click()

        expect(row.locator(".state")).not_to_have_text("open", timeout=15_000)
        assert fuse.gate("agent-loop").allowed  # closed for every process, not just the page
        expect(page.locator("#events .event.reset").first).to_contain_text("agent-loop")
        page.screenshot(path=str(tmp_path / "dashboard-reset.png"), full_page=True)

        # A label is untrusted text: shown as such, never run.
        script_id = Identity.named("<script>alert('label')</script>").key_id
        label = page.locator(f'tr[data-key-id="{script_id}"] .label')
        expect(label).to_have_text("<script>alert('label')</script>")
        assert dialogs == []
        browser.close()
    fuse.store.close()  # type: ignore[attr-defined]
