#!/usr/bin/env bash
# Create the second venv the MCP tests need: mcp 1.x (client and FastMCP server) cannot share
# a venv with mcp 2.x. Then point the tests at it:
#   bash scripts/mcp1-venv.sh .venv-mcp1 && export TOKENFUSE_MCP1_PYTHON=$PWD/.venv-mcp1/bin/python
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:?usage: scripts/mcp1-venv.sh DIR}
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q -e ".[mcp1-test]"
"$venv/bin/python" -c 'import importlib.metadata as m; print("mcp", m.version("mcp"), "in", __import__("sys").prefix)'
