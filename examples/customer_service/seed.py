"""Seed a customer's memory through the public memory API (`loopstack.memory.AsyncMemoryStore`): the
profile the shop's CRM holds and the customer's past tickets.

    python -m examples.customer_service.seed --user USER [--lang en|zh]

The store is the one ``loopstack agent run`` opens (``$LOOPSTACK_HOME/memory`` unless
``LOOPSTACK_MEMORY_URL`` says otherwise). Each record carries the CRM as its evidence, so it is
injected as known, not as a guess; seeding twice adds nothing (duplicates are recognised).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from loopstack.memory import AsyncMemoryStore

SHOP = json.loads((Path(__file__).parent / "shop.json").read_text(encoding="utf-8"))
CUSTOMER = "C-1042"

PROFILE = {
    "en": [
        ("fact", f"The user is the shop customer {SHOP['customers'][CUSTOMER]['name']}, "
                 f"customer id {CUSTOMER}."),
        ("fact", f"The user's customer tier is {SHOP['customers'][CUSTOMER]['tier']}."),
        ("episode", "Past ticket T-201 (2026-11-03): order B-1001, the coffee grinder, arrived "
                    "two days late; resolved with a 10% coupon."),
    ],
    "zh": [
        ("fact", f"用户是商店客户{SHOP['customers'][CUSTOMER]['name_zh']}，客户编号 {CUSTOMER}。"),
        ("fact", f"用户的客户等级是 {SHOP['customers'][CUSTOMER]['tier']}。"),
        ("episode", "过去的工单 T-201（2026-11-03）：订单 B-1001 咖啡研磨机晚到两天；"
                    "已用 10% 优惠券解决。"),
    ],
}  # fmt: skip


async def seed(user: str, lang: str, store: AsyncMemoryStore | None = None) -> list[str]:
    """Add the profile and past tickets for ``user``; returns the record ids."""
    st = store or AsyncMemoryStore()
    await st.open()
    try:
        ids = []
        for kind, text in PROFILE[lang]:
            ids.append(
                await st.add(
                    text, user_id=user, type=kind, source="tool", evidence=[f"crm:{CUSTOMER}"]
                )
            )
        return ids
    finally:
        if store is None:
            await st.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--user", required=True)
    ap.add_argument("--lang", choices=sorted(PROFILE), default="en")
    args = ap.parse_args()
    ids = asyncio.run(seed(args.user, args.lang))
    print(f"seeded {len(ids)} records for {args.user} ({args.lang})")


if __name__ == "__main__":
    main()
