"""Tool-call validity, constrained vs unconstrained, over the real-world tool corpus.

For each corpus entry and mode (``required``, ``named``, ``auto``) the same chat request
(the entry's prompt; tools = the entry's tool plus its two distractors) is sent twice:
once as is (constrained: our server's default) and once with
``extra_body={"loopstack": {"constrained": false}}`` (same prompt and engine, no grammar).
The first tool call of each answer is parsed and validated against the named tool's
``parameters`` with jsonschema.

``--api chat,responses,messages`` sends each request through ``/v1/chat/completions``,
``/v1/responses`` and ``/v1/messages`` (translations in ``wire_apis``); the Messages API has
no field for the switch, so it runs the constrained arm only.

    loopstack bench serving validity --limit 40 --out results/tool_validity.json
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import httpx
import typer

from loopstack.bench.commandline import benchmark_app, parse_command
from loopstack.bench.common import (
    CORPUS_PATH,
    DEFAULT_BASE_URL,
    JSON,
    UNCONSTRAINED_EXTRA,
    calls_from_text,
    check_call,
    connect,
    error_text,
    finish,
    fmt_pct,
    is_transport_error,
    load_corpus,
    pick_spread,
    print_table,
    tool_choice_for,
    tool_index,
    tools_for,
    write_json,
)
from loopstack.bench.serving import wire_apis
from loopstack.bench.serving.wire_apis import Api, WireError

MODES = ("required", "named", "auto")


def request_kwargs(
    entry: JSON,
    mode: str,
    arm: str,
    index: dict[str, JSON],
    model: str,
    max_tokens: int,
    temperature: float,
    seed: int | None,
) -> JSON:
    """The chat.completions.create keyword arguments for one (entry, mode, arm)."""
    kwargs: JSON = {
        "model": model,
        "messages": [{"role": "user", "content": entry["prompt"]}],
        "tools": tools_for(entry, index),
        "tool_choice": tool_choice_for(mode, entry),
        "max_tokens": max_tokens,
        "temperature": temperature,
    }
    if seed is not None:
        kwargs["seed"] = seed
    if arm == "unconstrained":
        kwargs["extra_body"] = UNCONSTRAINED_EXTRA
    elif arm != "constrained":
        raise ValueError(f"unknown arm {arm!r}")
    return kwargs


def arm_label(api: str, arm: str) -> str:
    """The summary's arm key: ``constrained`` for chat, ``responses/constrained`` else."""
    return arm if api == "chat" else f"{api}/{arm}"


def evaluate_response(
    entry: JSON,
    mode: str,
    arm: str,
    message: Any,
    finish_reason: str | None,
    schemas: dict,
    api: Api = "chat",
) -> JSON:
    """Turn one answer (read back into the chat shape) into a record (pure: ``message``
    is a dict or SDK object)."""
    msg = message if isinstance(message, dict) else message.model_dump()
    expected = entry["tool"]["function"]["name"]
    raw_calls = msg.get("tool_calls") or []
    calls = [(c["function"].get("name"), c["function"].get("arguments")) for c in raw_calls]
    rec: JSON = {
        "id": entry["id"],
        "mode": mode,
        "arm": arm,
        "api": api,
        "status": "ok",
        "finish_reason": finish_reason,
        "n_calls": len(calls),
        "expected": expected,
    }
    if calls:
        first = check_call(calls[0][0], calls[0][1], expected, schemas)
        rec.update(
            name=first.name,
            parses=first.parses,
            valid=first.valid,
            right_name=first.right_name,
            error=first.error,
            all_valid=all(check_call(n, a, expected, schemas).valid for n, a in calls),
            arguments=calls[0][1] if isinstance(calls[0][1], str) else json.dumps(calls[0][1]),
        )
    else:
        content = msg.get("content") or ""
        text_calls = calls_from_text(content)
        rec["content"] = content[:500]
        if text_calls:
            tc = check_call(text_calls[0][0], text_calls[0][1], expected, schemas)
            rec["text_call"] = {"name": tc.name, "valid": tc.valid, "error": tc.error}
    return rec


def summarize(records: list[JSON]) -> JSON:
    """Per mode and arm: counts and rates (see module doc)."""
    groups: dict[tuple[str, str], list[JSON]] = defaultdict(list)
    for r in records:
        groups[(r["mode"], arm_label(r.get("api", "chat"), r["arm"]))].append(r)
    out: JSON = {}
    for (mode, arm), recs in sorted(groups.items()):
        ok = [r for r in recs if r["status"] == "ok"]
        called = [r for r in ok if r["n_calls"] > 0]
        valid = [r for r in called if r.get("valid")]
        errors = Counter(r["error"] for r in recs if r["status"] != "ok")
        out.setdefault(mode, {})[arm] = {
            "api": recs[0].get("api", "chat"),
            "prompts": len(recs),
            "http_errors": sum(r["status"] == "http_error" for r in recs),
            "transport_errors": sum(r["status"] == "transport_error" for r in recs),
            "error_messages": dict(errors.most_common(5)),
            "answered": len(ok),
            "calls_produced": len(called),
            "call_rate": len(called) / len(recs) if recs else None,
            "parses": sum(bool(r.get("parses")) for r in called),
            "valid": len(valid),
            "right_name": sum(bool(r.get("right_name")) for r in called),
            "valid_and_right": sum(bool(r.get("right_name")) for r in valid),
            "all_calls_valid": sum(bool(r.get("all_valid")) for r in called),
            "valid_per_call": len(valid) / len(called) if called else None,
            "valid_per_prompt": len(valid) / len(recs) if recs else None,
            "text_calls": sum("text_call" in r for r in ok),
            "text_calls_valid": sum(bool(r.get("text_call", {}).get("valid")) for r in ok),
            "finish_length": sum(r.get("finish_reason") == "length" for r in ok),
            "top_schema_errors": dict(
                Counter(
                    (r.get("error") or "").split(":")[0] for r in called if not r.get("valid")
                ).most_common(5)
            ),
        }
    return out


def print_summary(summary: JSON) -> None:
    headers = [
        "mode",
        "arm",
        "prompts",
        "http_err",
        "calls",
        "call_rate",
        "parses",
        "valid/calls",
        "valid/prompts",
        "right_name",
        "text_calls",
    ]
    rows = []
    for mode, arms in summary.items():
        for arm, s in arms.items():
            rows.append(
                [
                    mode,
                    arm,
                    s["prompts"],
                    s["http_errors"] + s["transport_errors"],
                    s["calls_produced"],
                    fmt_pct(s["calls_produced"], s["prompts"]),
                    fmt_pct(s["parses"], s["calls_produced"]),
                    fmt_pct(s["valid"], s["calls_produced"]),
                    fmt_pct(s["valid"], s["prompts"]),
                    fmt_pct(s["right_name"], s["calls_produced"]),
                    s["text_calls"],
                ]
            )
    print_table(headers, rows)
    for mode, arms in summary.items():
        for arm, s in arms.items():
            if s["error_messages"]:
                print(f"errors {mode}/{arm}: {s['error_messages']}")


async def run(args: SimpleNamespace) -> int:
    corpus = load_corpus(Path(args.corpus))
    index = tool_index(corpus)
    schemas = {name: tool["function"]["parameters"] for name, tool in index.items()}
    entries = pick_spread(corpus, args.limit) if args.limit else corpus
    if args.ids:  # e.g. re-running the entries an earlier run lost to an engine failure
        wanted = set(args.ids)
        entries = [e for e in entries if e["id"] in wanted]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    for m in modes:
        if m not in MODES:
            raise SystemExit(f"unknown mode {m!r}")
    apis = wire_apis.parse_apis(args.api)
    combos = [(api, arm) for api in apis for arm in arms if wire_apis.arm_supported(api, arm)]
    for api, arm in [(api, arm) for api in apis for arm in arms]:
        if (api, arm) not in combos:
            print(f"skipped: {api}/{arm} (the API has no field for the switch)", file=sys.stderr)
    if (connected := await connect(args.base_url, args.api_key, args.timeout, args.model)) is None:
        return 2
    client, model = connected
    http = wire_apis.make_http(args.base_url, args.api_key, args.timeout)
    sem = asyncio.Semaphore(args.concurrency)
    done = 0
    total = len(entries) * len(modes) * len(combos)

    async def ask(api: Api, kwargs: JSON) -> tuple[Any, str | None, int | None]:
        """(message, finish_reason, completion_tokens) through one API."""
        if api != "chat":
            answer = await wire_apis.send(http, api, kwargs)
            return answer.message, answer.finish_reason, answer.completion_tokens
        resp = await client.chat.completions.create(**kwargs)
        tokens = resp.usage.completion_tokens if resp.usage is not None else None
        return resp.choices[0].message, resp.choices[0].finish_reason, tokens

    async def one(entry: JSON, mode: str, api: Api, arm: str) -> JSON:
        nonlocal done
        kwargs = request_kwargs(
            entry, mode, arm, index, model, args.max_tokens, args.temperature, args.seed
        )
        async with sem:
            t0 = time.perf_counter()
            try:
                message, finish_reason, tokens = await ask(api, kwargs)
                rec = evaluate_response(entry, mode, arm, message, finish_reason, schemas, api)
                if tokens is not None:
                    rec["completion_tokens"] = tokens
            except Exception as exc:
                transport = is_transport_error(exc) or isinstance(exc, httpx.TransportError)
                status = "transport_error" if transport else "http_error"
                rec = {"id": entry["id"], "mode": mode, "arm": arm, "api": api, "status": status}
                rec["error"] = str(exc)[:300] if isinstance(exc, WireError) else error_text(exc)
            rec["latency_s"] = round(time.perf_counter() - t0, 3)
        done += 1
        if args.progress and done % args.progress == 0:
            print(f"  {done}/{total}", file=sys.stderr)
        return rec

    # Arms alternate per request (and their order flips per entry) so that drift in
    # server load does not favour one arm.
    jobs: list[Awaitable[JSON]] = []
    for i, entry in enumerate(entries):
        for mode in modes:
            order = combos if i % 2 == 0 else list(reversed(combos))
            jobs.extend(one(entry, mode, api, arm) for api, arm in order)
    t0 = time.perf_counter()
    try:
        records = await asyncio.gather(*jobs)
    finally:
        await http.aclose()
    elapsed = time.perf_counter() - t0
    summary = summarize(list(records))
    print(
        f"model={model} base_url={args.base_url} apis={','.join(apis)} "
        f"prompts={len(entries)} in {elapsed:.0f}s"
    )
    print_summary(summary)
    transport = sum(r["status"] == "transport_error" for r in records)
    extra = {"model": model, "apis": list(apis), "elapsed_s": round(elapsed, 1)}
    results = {"summary": summary, "records": records}
    return finish(args, "tool_validity", extra, results, transport)


app = benchmark_app(__doc__.split("\n\n")[0])


@app.command()
def options(
    base_url: str = typer.Option(DEFAULT_BASE_URL),
    api_key: str = typer.Option("EMPTY"),
    model: str | None = typer.Option(None, help="default: first model from /v1/models"),
    corpus: str = typer.Option(str(CORPUS_PATH)),
    limit: int = typer.Option(0, help="entries, spread over the corpus"),
    merge: list[str] | None = typer.Option(
        None,
        metavar="JSON",
        help="no requests: summarize the first results file with records replaced by later "
        "files' (a --ids re-run)",
    ),
    ids: str | None = typer.Option(
        None, help="file of entry ids (whitespace-separated): only these"
    ),
    modes: str = typer.Option("required,named,auto"),
    arms: str = typer.Option("constrained,unconstrained"),
    api: str = typer.Option(
        "chat",
        help="chat, responses, messages, or a comma list: the wire API(s) each request goes "
        "through (messages: constrained arm only)",
    ),
    concurrency: int = typer.Option(8),
    max_tokens: int = typer.Option(256),
    temperature: float = typer.Option(0.0),
    seed: int | None = typer.Option(None),
    timeout: float = typer.Option(600.0, help="per request, seconds"),
    progress: int = typer.Option(20, help="print every N requests; 0 off"),
    out: str | None = typer.Option(None, help="write summary and per-request records as JSON"),
) -> SimpleNamespace:
    args = SimpleNamespace(**locals())
    if args.ids:
        args.ids = sorted(set(Path(args.ids).read_text().split()))
    return args


def merge(paths: list[str], out: str | None) -> int:
    """Records of the first file, each replaced by a later file's record for the same
    (entry, mode, arm, api): how a re-run (``--ids``) of lost requests completes a run."""
    merged: dict[tuple[str, str, str, str], JSON] = {}
    for path in paths:
        for r in json.loads(Path(path).read_text())["records"]:
            key = (r["id"], r["mode"], r["arm"], r.get("api", "chat"))
            if key in merged or path == paths[0]:
                merged[key] = r
    records = list(merged.values())
    summary = summarize(records)
    print(f"merged {paths}: {len(records)} records")
    print_summary(summary)
    if out:
        write_json(out, {"bench": "tool_validity", "merged_from": paths, "summary": summary,
                         "records": records})  # fmt: skip
        print(f"wrote {out}")
    return 0


def parse_args(argv: list[str] | None = None) -> SimpleNamespace:
    return cast(SimpleNamespace, parse_command(app, argv))


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed
        return int(exc.code or 0)
    if args.merge:
        return merge(args.merge, args.out)
    return asyncio.run(run(args))


if __name__ == "__main__":
    raise SystemExit(main())
