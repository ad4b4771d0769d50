"""Example tools for the `sales` worker: a small in-memory sales table."""

from __future__ import annotations

SALES = {  # revenue per region and month, in EUR
    "2025-03": {"North": 12400, "South": 9800, "East": 15100, "West": 7300},
    "2025-04": {"North": 13100, "South": 10200, "East": 14800, "West": 8900},
}


def sales_by_region(month: str) -> dict:
    """Revenue per region for one month, and the month's total.

    Args:
        month: The month as YYYY-MM, for example 2025-03.
    """
    if month not in SALES:
        raise ValueError(f"no data for {month!r}; months: {', '.join(SALES)}")
    rows = SALES[month]
    return {"month": month, "revenue": rows, "total": sum(rows.values())}
