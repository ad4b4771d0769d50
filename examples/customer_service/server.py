"""The shop's MCP server (official `mcp` SDK): orders, tickets and refunds over stdio.

    SHOP_STATE_DIR=/tmp/shop python examples/customer_service/server.py

It needs ``SHOP_STATE_DIR`` (where executed refunds are written, ``actions.jsonl``): without it,
it says so on stderr and offers no tools, which is why the agent is started with
``--mcp-env SHOP_STATE_DIR=...`` (an MCP server gets only the variables it is given). The
catalogue is ``shop.json`` beside this file (``SHOP_DATA`` to use another).

``refund_order`` is annotated destructive, so the agent treats it as dangerous: each call needs
the host's approval. The others are read-only.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

HERE = Path(__file__).parent
DATA = Path(os.environ.get("SHOP_DATA") or HERE / "shop.json")
STATE = os.environ.get("SHOP_STATE_DIR", "")

app = MCPServer("shop", instructions="Orders, support tickets and refunds of the shop.")
READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False)


def _shop() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DATA.read_text(encoding="utf-8"))
    return data


def _refunded() -> set[str]:
    path = Path(STATE) / "actions.jsonl"
    if not path.exists():
        return set()
    return {
        json.loads(x)["arguments"]["order_id"]
        for x in path.read_text().splitlines()
        if x.strip() and json.loads(x).get("action") == "refund_order"
    }


def _public(order: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in order.items() if k != "item_zh"}
    out["item_zh"] = order.get("item_zh", "")
    if order["order_id"] in _refunded():
        out["refund"] = "refunded"
    return out


def find_orders(customer_id: str) -> list[dict[str, Any]]:
    """All orders of a customer, newest first.

    Args:
        customer_id: The customer's id, for example C-1042.
    """
    orders = [o for o in _shop()["orders"] if o["customer_id"] == customer_id.strip()]
    if not orders:
        raise ValueError(f"no orders for customer {customer_id!r}")
    return [_public(o) for o in sorted(orders, key=lambda o: o["ordered"], reverse=True)]


def get_order(order_id: str) -> dict[str, Any]:
    """One order: item, total, status, carrier, tracking number, delivery date or ETA.

    Args:
        order_id: The order id, for example B-1001.
    """
    for o in _shop()["orders"]:
        if o["order_id"] == order_id.strip().upper():
            return _public(o)
    raise ValueError(f"no order {order_id!r}")


def get_ticket(ticket_id: str) -> dict[str, Any]:
    """A support ticket as the customer wrote it (subject and body).

    Args:
        ticket_id: The ticket id, for example T-301.
    """
    ticket = _shop()["tickets"].get(ticket_id.strip().upper())
    if ticket is None:
        raise ValueError(f"no ticket {ticket_id!r}")
    return {"ticket_id": ticket_id.strip().upper(), **ticket}


def refund_order(order_id: str, reason: str) -> dict[str, Any]:
    """Refund an order in full to the customer's payment method. Irreversible.

    Args:
        order_id: The order id to refund, for example B-1002.
        reason: Why it is refunded, in a few words.
    """
    order = get_order(order_id)
    if order.get("refund") == "refunded":
        raise ValueError(f"order {order['order_id']} is already refunded")
    line = {
        "action": "refund_order",
        "arguments": {"order_id": order["order_id"], "reason": reason},
        "at": time.time(),
    }
    with (Path(STATE) / "actions.jsonl").open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(line, ensure_ascii=False) + "\n")
    return {"order_id": order["order_id"], "refunded_eur": order["total_eur"], "status": "refunded"}


if STATE and Path(STATE).is_dir():
    app.tool(annotations=READ_ONLY)(find_orders)
    app.tool(annotations=READ_ONLY)(get_order)
    app.tool(annotations=READ_ONLY)(get_ticket)
    app.tool(annotations=ToolAnnotations(destructive_hint=True, read_only_hint=False))(refund_order)
else:
    print(
        f"shop: SHOP_STATE_DIR is not set or not a directory ({STATE!r}); no tools offered",
        file=sys.stderr,
    )


if __name__ == "__main__":
    app.run("stdio")
