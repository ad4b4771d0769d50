"""How expensive are our constraints for the engine? Compiles the regexes a corpus request
makes vLLM build (the call head over the offered names, then each tool's arguments) into
the Outlines index, with vLLM's own vocabulary code, reporting time and peak RSS.

    loopstack bench serving constraint-compile --limit 40 [--model-path DIR]

With ``--states``, no vLLM: every corpus schema goes through the server's own admission
(`compile_schema`, then `AutomatonProbe`), reporting regex size, automaton states and
refusals - what decides whether a schema is accepted.

    loopstack bench serving constraint-compile --states [--limit 0]

With ``--backend xgrammar|guidance|outlines --tools 30``: what a new tool set costs before
its first step - the first N corpus tools as one request's constraint, compiled with the
model's vocabulary as the engine compiles it (the grammar backends: the whole ``auto`` turn
and the ``required`` turn, in the server's own sandbox; outlines: the head regex
and every tool's arguments regex into the Outlines index).

    loopstack bench serving constraint-compile --backend xgrammar --tools 30
"""

from __future__ import annotations

import asyncio
import json
import resource
import statistics
import time
from types import SimpleNamespace
from typing import Any, Literal

import typer

from loopstack.bench.commandline import benchmark_app, run_command
from loopstack.bench.common import CORPUS_PATH
from loopstack.serving.constraint.regexes import AutomatonProbe, RegexSchemas
from loopstack.serving.constraint.schema_regex import arguments_regex, compile_schema, name_regex
from loopstack.serving.exceptions import InvalidRequest

CORPUS = CORPUS_PATH


app = benchmark_app(__doc__)


@app.command()
def constraint_compile(
    limit: int = typer.Option(40, help="entries (with --states 0 = all)"),
    model_path: str | None = typer.Option(None, help="HF folder (default: offline model)"),
    single: bool = typer.Option(False, "--single", help="only the tool, no distractors"),
    states: bool = typer.Option(False, "--states", help="admission only: regex and states"),
    backend: Literal["xgrammar", "guidance", "outlines"] | None = typer.Option(None),
    tools: int = typer.Option(30, help="with --backend: tools in the set"),
) -> None:
    return _command(SimpleNamespace(**locals()))


def _command(args: SimpleNamespace) -> None:
    if args.backend:
        toolset(args.backend, args.tools, args.model_path)
        return
    if args.states:
        asyncio.run(states(args.limit))
        return

    import outlines_core as oc
    from transformers import AutoTokenizer
    from vllm.v1.structured_output.utils import get_outlines_vocabulary

    from loopstack.serving.config import ServerSettings
    from loopstack.serving.engine.model_store import ensure_offline_default

    path = args.model_path or str(ensure_offline_default(ServerSettings().home))
    vocab = get_outlines_vocabulary(AutoTokenizer.from_pretrained(path))  # type: ignore[arg-type]
    entries = [json.loads(line) for line in CORPUS.read_text().splitlines()]
    by_name = {e["tool"]["function"]["name"]: e for e in entries}
    step = max(1, len(entries) // args.limit)
    times, sizes, exact = [], [], 0
    for e in entries[::step][: args.limit]:
        names = [e["tool"]["function"]["name"]] + ([] if args.single else e["distractors"])
        tools = {n: compile_schema(by_name[n]["tool"]["function"]["parameters"]) for n in names}
        exact += all(t.exact for t in tools.values())
        regexes = [name_regex(names)] + [arguments_regex(t, parallel=True) for t in tools.values()]
        started = time.perf_counter()
        for regex in regexes:
            oc.Index(regex, vocab.inner)
        times.append(time.perf_counter() - started)
        sizes.append(max(len(r) for r in regexes))
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"{e['id']:<60} {sizes[-1]:>7} chars {times[-1]:7.2f} s  maxrss {rss:,.0f} MB")
    times.sort()
    print(
        f"\n{len(times)} requests (uncached: head + every tool): "
        f"compile p50 {statistics.median(times):.2f} s, "
        f"p90 {times[int(0.9 * (len(times) - 1))]:.2f} s, max {times[-1]:.2f} s; "
        f"largest regex chars p50 {statistics.median(sizes):.0f}; exact (no post-check needed) "
        f"{exact}/{len(times)}"
    )


def toolset(backend: str, n: int, model_path: str | None) -> None:
    from loopstack.serving.config import ServerSettings
    from loopstack.serving.constraint.backend import TurnSpec
    from loopstack.serving.constraint.factory import make_backend
    from loopstack.serving.engine.model_store import ensure_offline_default

    path = model_path or str(ensure_offline_default(ServerSettings().home))
    entries = [json.loads(line) for line in CORPUS.read_text().splitlines()][:n]
    tools = {e["tool"]["function"]["name"]: e["tool"]["function"]["parameters"] for e in entries}
    if backend == "outlines":
        import outlines_core as oc
        from transformers import AutoTokenizer
        from vllm.v1.structured_output.utils import get_outlines_vocabulary

        vocab = get_outlines_vocabulary(AutoTokenizer.from_pretrained(path))  # type: ignore[arg-type]
        started = time.perf_counter()
        compiled = {k: compile_schema(v) for k, v in tools.items()}
        regexes = [name_regex(list(compiled))]
        regexes += [arguments_regex(c, parallel=True) for c in compiled.values()]
        for regex in regexes:
            oc.Index(regex, vocab.inner)
        print(f"outlines: {len(tools)} tools, head + arguments regexes indexed in "
              f"{time.perf_counter() - started:.2f} s")  # fmt: skip
        return
    grammar: Any = make_backend(backend, path, mode="thread")  # type: ignore[arg-type]
    started = time.perf_counter()
    warm = TurnSpec("required", {"warm": {"type": "object"}}, True)
    asyncio.run(grammar.constraint(warm, what="w"))
    print(f"{backend}: vocabulary loaded in {time.perf_counter() - started:.2f} s")
    for mode in ("auto", "required"):
        started = time.perf_counter()
        spec = TurnSpec(mode, tools, parallel=True)  # type: ignore[arg-type]
        try:
            asyncio.run(grammar.constraint(spec, what="tools"))
            verdict = "compiled"
        except InvalidRequest as exc:
            verdict = f"refused ({exc.message[:120]})"
        print(f"{backend}: {len(tools)} tools, {mode} turn {verdict} in "
              f"{time.perf_counter() - started:.3f} s")  # fmt: skip


async def states(limit: int) -> None:
    entries = [json.loads(line) for line in CORPUS.read_text().splitlines()]
    if limit:
        entries = entries[:: max(1, len(entries) // limit)][:limit]
    probe = AutomatonProbe()
    rows, refused, exact = [], [], 0
    for e in entries:
        started = time.perf_counter()
        try:  # what the server does with a new schema
            compiled = await RegexSchemas(probe=probe).get(e["tool"]["function"]["parameters"])
        except InvalidRequest as exc:
            refused.append((e["id"], exc.message))
            continue
        secs = time.perf_counter() - started
        exact += compiled.exact
        n = await probe.check(compiled.regex)
        rows.append((n, len(compiled.regex), secs, e["id"]))
    rows.sort()
    for q in (0.5, 0.9, 0.99, 1.0):
        n, chars, secs, name = rows[min(len(rows) - 1, int(q * len(rows)))]
        print(f"p{q * 100:g}: {n:>6,} states {chars:>7,} chars  {secs:.2f} s  ({name})")
    slowest = max(r[2] for r in rows)
    print(
        f"\n{len(entries)} schemas: {len(rows)} accepted, {len(refused)} refused "
        f"(limit {probe.max_states:,} states); admission took at most {slowest:.2f} s; "
        f"{exact} enforced exactly (the rest validated after generation)"
    )
    for name, message in refused:
        print(f"  refused {name}: {message}")


def main(argv: list[str] | None = None) -> int:
    return run_command(app, argv)


if __name__ == "__main__":
    raise SystemExit(main())
