#!/usr/bin/env bash
# Remake docs/dashboard.png, the README's picture of the admin dashboard: the browser test's
# screenshot of a key that has just tripped. Needs what the test needs: Redis on
# 127.0.0.1:6379 (or TOKENFUSE_REDIS_URL), Debian's chromium and Playwright for Python.
set -euo pipefail
cd "$(dirname "$0")/.."
TOKENFUSE_DASHBOARD_SCREENSHOT=docs/dashboard.png python -m pytest -q -p no:cacheprovider \
    tests/admin/test_browser.py
ls -l docs/dashboard.png
