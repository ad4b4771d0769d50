"""Golden tools that fail: one raises every time, one hangs past any sane timeout."""

from __future__ import annotations

import time

from loopstack.bench.golden import data as _data


def get_stock_price(symbol: str) -> float:
    """Current stock price of a ticker symbol, in USD.

    Args:
        symbol: Ticker, for example ACME.
    """
    _data.record_action("get_stock_price", symbol=symbol)
    raise ConnectionError("market data service unavailable (HTTP 503)")


def slow_quote(symbol: str) -> float:
    """A delayed stock quote from a slow provider.

    Args:
        symbol: Ticker, for example ACME.
    """
    _data.record_action("slow_quote", symbol=symbol)
    time.sleep(600)
    return 1.0
