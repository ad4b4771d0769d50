"""The customer-service example's wiring, with its real MCP server and a scripted model (the
golden tasks run it with the real one): the server needs --mcp-env, refunds need approval,
and the customer's memory is seeded through the public memory API."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from examples.customer_service.seed import seed
from loopstack.agent import cli
from loopstack.agent.scripted import ScriptedModel, call
from loopstack.memory import AsyncMemoryStore, HashingEmbedder, MemorySettings

ROOT = Path(__file__).resolve().parents[2]
SHOP = f"shop={sys.executable} {ROOT / 'examples' / 'customer_service' / 'server.py'}"
pytestmark = pytest.mark.timeout(120)


def run_cli(monkeypatch: pytest.MonkeyPatch, model: ScriptedModel, *args: str) -> Any:
    monkeypatch.setattr(cli, "AsyncOpenAI", lambda **kw: model.client())
    return CliRunner().invoke(cli.app, ["run", *args])


def actions(state: Path) -> list[dict[str, Any]]:
    path = state / "actions.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_order_lookup_through_the_shop_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = ScriptedModel(
        [
            call("shop__find_orders", customer_id="C-1042"),
            call("shop__get_order", order_id="B-1003"),
        ],
        answer="Your blender is in transit, due 2026-12-09.",
    )
    args = ["Where is my blender?", "--mcp", SHOP, "--mcp-env", f"SHOP_STATE_DIR={tmp_path}"]
    res = run_cli(monkeypatch, model, *args, "--json", "--no-memory")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert [(c["name"], c["status"]) for c in out["tool_calls"][:2]] == [
        ("shop__find_orders", "ok"),
        ("shop__get_order", "ok"),
    ]


def test_a_refund_runs_only_with_approval(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refund() -> ScriptedModel:
        return ScriptedModel(
            [call("shop__refund_order", order_id="B-1002", reason="arrived broken")],
            answer="done",
        )

    args = ["Refund order B-1002, it arrived broken.", "--mcp", SHOP, "--json", "--no-memory"]
    args += ["--mcp-env", f"SHOP_STATE_DIR={tmp_path}"]
    res = run_cli(monkeypatch, refund(), *args)
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["tool_calls"][0]["status"] == "error" and actions(tmp_path) == []
    res = run_cli(monkeypatch, refund(), *args, "--approve")
    assert res.exit_code == 0, res.output
    assert [a["arguments"]["order_id"] for a in actions(tmp_path)] == ["B-1002"]


@pytest.mark.parametrize(("lang", "query"), [("en", "customer id"), ("zh", "客户编号")])
async def test_the_customer_memory_is_seeded_through_the_public_api(
    tmp_path: Path, lang: str, query: str
) -> None:
    st = AsyncMemoryStore(
        tmp_path / "m.db", embedder=HashingEmbedder(), settings=MemorySettings(threshold=0.0)
    )
    await st.open()
    try:
        ids = await seed("cust", lang, store=st)
        assert len(ids) == 3 and await seed("cust", lang, store=st) == ids  # no duplicates
        rec = await st.recall(query, user_id="cust")
        assert "C-1042" in rec.block and "evidence: crm:C-1042" in rec.block
        assert (await st.recall(query, user_id="someone-else")).block == ""
    finally:
        await st.close()
