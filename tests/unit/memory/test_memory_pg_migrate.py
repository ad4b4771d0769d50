"""``loopstack memory migrate --from sqlite:PATH --to postgresql://...`` on a real Postgres."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from loopstack.bench.memory.local_postgres import LocalPostgres
from loopstack.memory import AsyncMemoryStore, HashingEmbedder, MemorySettings
from loopstack.memory.cli import app


async def test_migrate_copies_history_and_change_log(
    postgres: LocalPostgres, tmp_path: Path, settings: MemorySettings
) -> None:
    db = tmp_path / "m.db"
    src = AsyncMemoryStore(db, embedder=HashingEmbedder(), settings=settings)
    old = await src.add("My sister lives in Lisbon and works as a nurse.", user_id="u1")
    new = await src.add(
        "My sister moved to Porto last month and works there as a nurse.", user_id="u1"
    )
    await src.verify(new, user_id="u1", by_user=True)
    gone = await src.add("The wifi password hint is the cat's name", user_id="u2")
    await src.forget(gone, user_id="u2")
    await src.add_many([f"note {i} about project kestrel{i}" for i in range(60)], user_id="u2")
    before = await src.stats()
    await src.close()

    url = postgres.new_schema()
    runner = CliRunner()
    res = runner.invoke(app, ["migrate", "--from", f"sqlite:{db}", "--to", url, "--samples", "10"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.output)
    assert report["ok"] is True
    assert report["recall_spot_check"] == "10/10 same top record"
    assert report["counts"]["records"] == {"from": before["records"], "to": before["records"]}
    assert report["change_seq"] > 0  # the log itself was compacted when the store closed

    dst = AsyncMemoryStore(
        url,
        embedder=HashingEmbedder(),
        settings=settings.model_copy(update={"index_dir": tmp_path / "replica"}),
    )
    chain = await dst.history(new, user_id="u1")
    assert [r.id for r in chain] == [old, new]  # the supersede chain came along
    assert any(e.kind == "confirmed" for e in chain[1].events)
    assert any(e.kind == "contradicted" for e in chain[0].events)
    after = await dst.stats()
    assert (after["active"], after["index_vectors"]) == (before["active"], before["active"])
    rec = await dst.recall("where does my sister live", user_id="u1")
    assert [c.id for c in rec.items] == [new]
    # New writes continue the copied rowids and change log.
    await dst.add("My sister has a cat called Miso", user_id="u1")
    assert (await dst.stats())["applied_seq"] == report["change_seq"] + 1
    await dst.close()

    again = runner.invoke(app, ["migrate", "--from", f"sqlite:{db}", "--to", url])
    assert again.exit_code == 1 and "not empty" in again.output
    postgres.drop_schema(url)
