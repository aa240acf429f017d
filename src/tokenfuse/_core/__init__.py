"""The policy core: pure functions of (state, amount, now, params) -> verdict.

No I/O and no clock reads happen here; every store applies exactly these rules (the Lua scripts
are checked against them by a differential test: docs/design.md, "Why the policy core exists
twice"). Functions update the state object they are given in place (stores own their state
objects) and return a verdict.
"""
