"""Dollars per model: the price table a run's ``usd`` limit is counted with.

Prices come from the ``genai-prices`` package (``pip install 'tokenfuse[prices]'``), which ships
a maintained table of every major provider's prices offline; a table of your own
(``set_prices``) wins over it, model by model. Input, output and cached input tokens are
priced separately. A model found in neither is priced at nothing: its calls count in tokens
only, and that is reported once per model (a log line and a ``price_unknown`` event).

Cached input: the usage readers report input tokens whole (cached ones included), so a
provider's cache discount is not applied and the dollars counted are an upper bound.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._errors import ConfigurationError
from .._events import logger

__all__ = ["Price", "cost", "has_prices", "set_prices", "unknown_model"]

_MAX_UNKNOWN = 256  # models remembered as reported: bounded against invented model names


@dataclass(frozen=True, slots=True)
class Price:
    """US dollars per million tokens; ``cached_input`` defaults to the input price.

    >>> Price(input=2.5, output=10.0, cached_input=1.25)
    Price(input=2.5, output=10.0, cached_input=1.25)
    """

    input: float
    output: float
    cached_input: float | None = None

    def __post_init__(self) -> None:
        for value in (self.input, self.output, self.cached_input):
            if value is not None and not (isinstance(value, (int, float)) and value >= 0):
                raise ConfigurationError(f"prices must be non-negative numbers, not {value!r}")


_own: dict[str, Price] = {}
_lock = threading.Lock()
_reported: set[str] = set()


def set_prices(table: Mapping[str, Price]) -> None:
    """Use these prices (US dollars per million tokens) for these models, before the
    ``genai-prices`` table; replaces the previous table of your own.

    >>> set_prices({"my-finetune": Price(input=3.0, output=12.0)})
    """
    checked = {}
    for model, price in table.items():
        if not isinstance(price, Price):
            raise ConfigurationError(f"the price of {model!r} must be a Price, not {price!r}")
        checked[str(model)] = price
    with _lock:
        _own.clear()
        _own.update(checked)


def has_prices() -> bool:
    """Whether dollars can be counted at all: ``genai-prices`` is installed, or a table of
    your own was set."""
    return bool(_own) or _package() is not None


@functools.cache
def _package() -> Any:
    try:
        import genai_prices
    except ImportError:
        return None
    return genai_prices


@functools.lru_cache(maxsize=512)
def _model_price(model: str, provider: str | None) -> Any:
    """genai-prices' price of the model (None: not known to it)."""
    package = _package()
    if package is None:
        return None
    usage = package.Usage(input_tokens=0, output_tokens=0)
    try:
        found = package.calc_price(usage, model_ref=model, provider_id=provider)
    except LookupError:
        if provider is None:
            return None
        return _model_price(model, None)  # the provider as we named it may not be theirs
    except Exception:
        return None
    return found.model_price


def cost(
    model: str | None,
    provider: str | None,
    *,
    input: float,
    output: float,
    cached: float = 0.0,
) -> float | None:
    """The price in US dollars of a call, or None when the model's price is unknown.

    ``input`` counts every input token, ``cached`` how many of them were read from the cache.
    """
    if not model:
        return None
    own = _own.get(model)
    if own is not None:
        cached_price = own.input if own.cached_input is None else own.cached_input
        fresh = max(input - cached, 0.0)
        return (fresh * own.input + cached * cached_price + output * own.output) / 1_000_000
    price = _model_price(model, provider if provider and provider != "unknown" else None)
    if price is None:
        return None
    usage = _package().Usage(
        input_tokens=round(input), output_tokens=round(output), cache_read_tokens=round(cached)
    )
    try:
        return float(price.calc_price(usage)["total_price"])
    except Exception:
        return None


def unknown_model(model: str | None) -> bool:
    """Whether the model's missing price is yet to be reported (True once per model)."""
    name = model or "(no model named)"
    with _lock:
        if name in _reported or len(_reported) >= _MAX_UNKNOWN:
            return False
        _reported.add(name)
    logger.warning(
        "tokenfuse: no price known for model %r: its calls count against run budgets in tokens "
        "only (install tokenfuse[prices] or tokenfuse.guards.set_prices({...}))",
        name,
    )
    return True
