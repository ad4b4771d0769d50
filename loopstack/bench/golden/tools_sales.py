"""Golden tools: a SQLite sales database (built by code in $GOLDEN_WORKDIR/sales.db)."""

from __future__ import annotations

from typing import Any

from loopstack.bench.golden import data as _data


def monthly_sales_report(month: str) -> dict[str, Any]:
    """Revenue per region for one month, with the same month last year and the year-over-year
    change in percent, plus the totals.

    Args:
        month: The month as YYYY-MM, for example 2025-03.
    """
    return _data.monthly_report(month)


def region_product_breakdown(region: str, month: str) -> dict[str, Any]:
    """Drill down into one region for one month: revenue, orders and year-over-year change per
    product.

    Args:
        region: One of North, South, East, West.
        month: The month as YYYY-MM.
    """
    if region.title() not in _data.REGIONS:
        raise ValueError(f"unknown region {region!r}; known: {', '.join(_data.REGIONS)}")
    return _data.region_drilldown(region.title(), month)
