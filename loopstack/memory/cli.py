"""``loopstack memory ...``: add, search, list, forget, history, reindex, stats, decay, migrate.

Mounted by the root CLI (``app.add_typer(loopstack.memory.cli.app, name="memory")``) and runnable on
its own: ``python -m loopstack.memory.cli --help``. Every command takes ``--db`` (default:
``$LOOPSTACK_MEMORY_URL``, else ``$LOOPSTACK_MEMORY_PATH`` or
``$LOOPSTACK_HOME/memory/memory.db``): a SQLite file or a ``postgresql://`` URL; ``--json`` prints
machine-readable output. Settings come from ``LOOPSTACK_MEMORY_*`` variables.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from loopstack.memory.config import MemorySettings
from loopstack.memory.exceptions import LoopstackMemoryError
from loopstack.memory.records import MemorySource, MemoryType, Record
from loopstack.memory.sync import MemoryStore

__all__ = ["app"]

app = typer.Typer(
    name="memory",
    help="Long-term memory: a SQLite or Postgres ledger with FAISS recall.",
    no_args_is_help=True,
    add_completion=False,
)

DbOpt = Annotated[
    str | None,
    typer.Option(
        "--db", help="Ledger: a SQLite file or a postgresql:// URL (LOOPSTACK_MEMORY_URL)."
    ),
]
UserOpt = Annotated[str, typer.Option("--user", "-u", help="User id (scope).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def _store(db: str | None) -> MemoryStore:
    settings = MemorySettings()
    return MemoryStore(db or settings.location(), settings=settings)


def _fmt_ts(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M")


def _line(r: Record) -> str:
    sup = f"  (superseded by {r.superseded_by})" if r.superseded_by else ""
    return (
        f"{r.id}  [{r.type.value} | {r.source.value} | w={r.weight:.2f} | "
        f"{_fmt_ts(r.created_at)}]  {r.text}{sup}"
    )


def _run(fn: Any) -> None:
    try:
        fn()
    except LoopstackMemoryError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=1) from exc


@app.command()
def add(
    text: Annotated[str, typer.Argument(help="The memory, one sentence.")],
    user: UserOpt,
    type: Annotated[MemoryType, typer.Option("--type", "-t")] = MemoryType.FACT,
    source: Annotated[MemorySource, typer.Option("--source", "-s")] = MemorySource.USER_EXPLICIT,
    evidence: Annotated[list[str] | None, typer.Option("--evidence", "-e")] = None,
    agent: Annotated[str | None, typer.Option("--agent")] = None,
    db: DbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Store a memory (redacted; duplicates return the existing id)."""

    def go() -> None:
        with _store(db) as st:
            rid = st.add(
                text,
                user_id=user,
                agent_id=agent,
                type=type,
                source=source,
                evidence=evidence or [],
            )
            typer.echo(json.dumps({"id": rid}) if as_json else rid)

    _run(go)


@app.command()
def search(
    query: Annotated[str, typer.Argument(help="What to recall.")],
    user: UserOpt,
    budget: Annotated[int, typer.Option("--budget", help="Token budget.")] = 600,
    mode: Annotated[str, typer.Option("--mode", help="hybrid | vector | keyword")] = "hybrid",
    explain: Annotated[bool, typer.Option("--explain", help="Show every candidate.")] = False,
    unverified: Annotated[
        bool, typer.Option("--unverified", help="Include records below the trust floor.")
    ] = False,
    db: DbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Run the recall pipeline and print the <memory> block (and why, with --explain)."""
    if mode not in ("hybrid", "vector", "keyword"):
        raise typer.BadParameter("mode must be hybrid, vector or keyword")

    def go() -> None:
        with _store(db) as st:
            rec = st.recall(
                query,
                user_id=user,
                budget_tokens=budget,
                mode=mode,  # type: ignore[arg-type]
                include_unverified=unverified,
            )
            if as_json:
                out: dict[str, Any] = {
                    "block": rec.block,
                    "items": [c.explain() for c in rec.items],
                }
                if explain:
                    out["trace"] = rec.trace()
                typer.echo(json.dumps(out, indent=2))
                return
            typer.echo(rec.block or "(nothing relevant enough to inject)")
            if explain:
                for c in rec.candidates:
                    mark = "+" if c.kept else "-"
                    typer.echo(
                        f"{mark} {c.score:.3f} sim={c.similarity:.3f} kw={c.keyword:.2f} "
                        f"trust={c.trust:.2f} ({c.provenance}) "
                        f"{c.id} {c.text[:60]!r}: {c.reason}"
                    )

    _run(go)


@app.command("list")
def list_(
    user: UserOpt,
    limit: Annotated[int, typer.Option("--limit", "-n")] = 50,
    all_: Annotated[bool, typer.Option("--all", help="Include superseded records.")] = False,
    db: DbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List a user's memories, newest first."""

    def go() -> None:
        with _store(db) as st:
            recs = st.list(user_id=user, include_superseded=all_, limit=limit)
            if as_json:
                typer.echo(json.dumps([r.to_dict() for r in recs], indent=2))
            else:
                for r in recs:
                    typer.echo(_line(r))

    _run(go)


@app.command()
def forget(
    user: UserOpt,
    record_id: Annotated[str | None, typer.Argument(help="Record id to delete.")] = None,
    match: Annotated[
        str | None, typer.Option("--match", help="Delete every record matching this text.")
    ] = None,
    db: DbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Delete a memory (and the versions it superseded) from ledger and index."""
    if (record_id is None) == (match is None):
        raise typer.BadParameter("give exactly one of RECORD_ID or --match")

    def go() -> None:
        with _store(db) as st:
            if record_id is not None:
                gone = st.forget(record_id, user_id=user)
            else:
                gone = st.forget_matching(match or "", user_id=user)
            typer.echo(
                json.dumps({"deleted": gone})
                if as_json
                else f"deleted {len(gone)}: " + " ".join(gone)
            )

    _run(go)


@app.command()
def history(
    record_id: Annotated[str, typer.Argument(help="Any record of the chain.")],
    user: UserOpt,
    db: DbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show the supersede chain of a record, oldest first, with its trust events."""

    def go() -> None:
        with _store(db) as st:
            chain = st.history(record_id, user_id=user)
            if as_json:
                typer.echo(json.dumps([r.to_dict() for r in chain], indent=2))
            else:
                for r in chain:
                    typer.echo(_line(r))
                    for e in r.events:
                        typer.echo(f"    {e.kind}: {e.detail}")

    _run(go)


@app.command()
def reindex(
    reembed: Annotated[
        bool, typer.Option("--reembed", help="Embed every text again (model changed).")
    ] = False,
    db: DbOpt = None,
) -> None:
    """Rebuild the FAISS index from the ledger."""

    def go() -> None:
        with _store(db) as st:
            typer.echo(json.dumps(st.reindex(reembed=reembed)))

    _run(go)


@app.command()
def stats(db: DbOpt = None) -> None:
    """Counts, sizes and index state."""

    def go() -> None:
        with _store(db) as st:
            typer.echo(json.dumps(st.stats(), indent=2))

    _run(go)


@app.command()
def decay(
    db: DbOpt = None,
    now: Annotated[
        float | None,
        typer.Option("--now", help="Decay as of this Unix time (default: the current time)."),
    ] = None,
) -> None:
    """Decay unused records' weights and prune faded non-explicit ones; prints
    {"decayed": records whose weight changed, "pruned": N}. A store also runs this by itself
    when it opens and a day passed (LOOPSTACK_MEMORY_DECAY_EVERY_HOURS)."""

    def go() -> None:
        with _store(db) as st:
            typer.echo(json.dumps(st.decay(now=now)))

    _run(go)


@app.command()
def migrate(
    source: Annotated[str, typer.Option("--from", help="sqlite:PATH of the store to copy.")],
    target: Annotated[str, typer.Option("--to", help="postgresql:// URL of an empty ledger.")],
    samples: Annotated[int, typer.Option(help="Records for the recall spot-check.")] = 20,
) -> None:
    """Copy a SQLite store (history and change log included) into Postgres, then verify
    table counts and a recall spot-check. Exits 1 when the verification fails."""

    def go() -> None:
        from loopstack.memory.migrate import migrate as run_migration

        report = run_migration(source, target, samples=samples, settings=MemorySettings())
        typer.echo(json.dumps(report.to_dict(), indent=2))
        if not report.ok:
            raise typer.Exit(1)

    _run(go)


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    app()


if __name__ == "__main__":
    main()
