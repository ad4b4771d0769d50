"""The sync wrapper's recall uses the configured budget, not a hard-coded one."""

from __future__ import annotations

from pathlib import Path

from loopstack.memory import HashingEmbedder, MemorySettings, MemoryStore


def test_sync_recall_defaults_to_configured_budget(tmp_path: Path) -> None:
    settings = MemorySettings(threshold=0.0, budget_tokens=90, persist_every=50)
    texts = [f"Project number {i} ships the blue widget release on Friday" for i in range(12)]
    with MemoryStore(tmp_path / "m.db", embedder=HashingEmbedder(), settings=settings) as st:
        st.add_many(texts, user_id="u", check_conflicts=False)
        default = st.recall("blue widget release", user_id="u")
        wide = st.recall("blue widget release", user_id="u", budget_tokens=600)
    assert 0 < default.tokens <= 90
    assert len(default.items) < len(wide.items) == 12
