"""Golden tools: fixed weather and exchange rates."""

from __future__ import annotations

from typing import Any

from loopstack.bench.golden import data as _data


def get_weather(city: str) -> dict[str, Any]:
    """Today's weather in a city: temperature in Celsius, condition and rain in mm.

    Args:
        city: City name, for example Lisbon.
    """
    found = _data.WEATHER.get(city.strip().lower())
    if found is None:
        raise ValueError(f"no weather for {city!r}; known: {', '.join(_data.WEATHER)}")
    return found


def get_exchange_rate(base: str, quote: str) -> dict[str, Any]:
    """How many units of the quote currency one unit of the base currency buys.

    Args:
        base: Currency code, for example EUR.
        quote: Currency code, for example JPY.
    """
    return {"base": base.upper(), "quote": quote.upper(), "rate": _data.rate(base, quote)}


def convert_currency(amount: float, base: str, quote: str) -> dict[str, Any]:
    """Convert an amount of money from one currency to another.

    Args:
        amount: The amount in the base currency.
        base: Currency code of the amount, for example USD.
        quote: Currency code to convert to, for example EUR.
    """
    r = _data.rate(base, quote)
    return {
        "amount": amount,
        "base": base.upper(),
        "quote": quote.upper(),
        "rate": r,
        "converted": round(amount * r, 2),
    }
