"""The run-budget rules, each on its own (``_core/budget.py``), on a simulated clock."""

from __future__ import annotations

from tokenfuse._core import budget
from tokenfuse._core.budget import NO_LIMIT, RunState

NOW = 1_767_225_600.0
TTL = 3_600.0


def run(tokens: float = NO_LIMIT, usd: float = NO_LIMIT) -> RunState:
    return budget.new_run(NOW, TTL, tokens, usd)


def test_a_reservation_is_refused_when_it_would_pass_the_limit_and_holds_nothing() -> None:
    state = run(tokens=1_000)
    assert budget.reserve(state, NOW, TTL, 600, 0).allowed
    refused = budget.reserve(state, NOW, TTL, 401, 0)
    assert (refused.allowed, refused.unit) == (False, "tokens")
    assert state.reserved_tokens == 600  # the refused 401 is not held
    assert budget.reserve(state, NOW, TTL, 400, 0).allowed  # exactly up to the limit


def test_reservations_count_until_settled_then_the_real_amount_counts() -> None:
    state = run(tokens=1_000)
    budget.reserve(state, NOW, TTL, 500, 0)
    budget.settle(state, NOW, TTL, 500, 0, 700, 0)  # the real bill is larger than the guess
    assert (state.spent_tokens, state.reserved_tokens) == (700, 0)
    assert not budget.reserve(state, NOW, TTL, 301, 0).allowed
    assert budget.reserve(state, NOW, TTL, 300, 0).allowed


def test_release_gives_the_reservation_back_and_never_goes_below_zero() -> None:
    state = run(tokens=100)
    budget.reserve(state, NOW, TTL, 80, 0)
    budget.release(state, NOW, TTL, 80, 0)
    assert state.reserved_tokens == 0 and state.spent_tokens == 0
    budget.release(state, NOW, TTL, 50, 1.0)  # a reservation the state no longer holds
    assert (state.reserved_tokens, state.reserved_usd) == (0, 0)


def test_dollars_are_limited_on_their_own() -> None:
    state = run(tokens=NO_LIMIT, usd=1.0)
    assert budget.reserve(state, NOW, TTL, 1e9, 0.6).allowed  # no token limit
    refused = budget.reserve(state, NOW, TTL, 0, 0.5)
    assert (refused.allowed, refused.unit) == (False, "usd")


def test_near_fires_once_at_80_percent_of_spending_and_exceeded_once() -> None:
    state = run(tokens=1_000)
    assert not budget.settle(state, NOW, TTL, 0, 0, 799, 0).near
    assert budget.settle(state, NOW, TTL, 0, 0, 1, 0).near
    assert not budget.settle(state, NOW, TTL, 0, 0, 1, 0).near
    first = budget.reserve(state, NOW, TTL, 500, 0)
    assert (first.allowed, first.exceeded) == (False, True)
    again = budget.reserve(state, NOW, TTL, 500, 0)
    assert (again.allowed, again.exceeded) == (False, False)


def test_overspending_by_a_settlement_counts_as_exceeded() -> None:
    state = run(tokens=100)
    budget.reserve(state, NOW, TTL, 90, 0)
    verdict = budget.settle(state, NOW, TTL, 90, 0, 130, 0)
    assert verdict.exceeded and verdict.allowed


def test_joining_keeps_the_limits_and_opening_again_replaces_them() -> None:
    state = run(tokens=1_000)
    budget.settle(state, NOW, TTL, 0, 0, 100, 0)
    joined = budget.open_run(state, NOW + 1, TTL, NO_LIMIT, NO_LIMIT, join=True)
    assert (joined.token_limit, joined.spent_tokens) == (1_000, 100)
    opened = budget.open_run(state, NOW + 2, TTL, 5_000, 2.0, join=False)
    assert (opened.token_limit, opened.usd_limit, opened.spent_tokens) == (5_000, 2.0, 100)


def test_a_run_expires_ttl_after_its_last_write() -> None:
    state = run(tokens=1_000)
    budget.settle(state, NOW + 3_000, TTL, 0, 0, 10, 0)  # the write moves the expiry
    assert budget.live(state, NOW + 3_600) is state
    assert budget.live(state, NOW + 6_600) is None
    fresh = budget.open_run(state, NOW + 6_600, TTL, NO_LIMIT, NO_LIMIT, join=True)
    assert (fresh.token_limit, fresh.spent_tokens) == (NO_LIMIT, 0)
