"""Tool selection: the right tool among many, the stated arguments, and no call where none fits.

    loopstack bench agent selection --base-url URL [--sizes 5,10,30] [--items 20]
        [--arms given,reversed,shuffled,ranked,top3,top5] [--concurrency 4] [--out DIR]

**Selection items** come from the tool-schema corpus (`loopstack/bench/corpus/tool_schemas.jsonl`: a
templated request naming concrete values, and the tool it is for) and from the golden tools
(`loopstack/bench/agent/selection_golden.json`). For each item and each size N, the request offers
the right tool and N - 1 others (the corpus entry's own look-alike distractors first, then a seeded
draw from the corpus and golden tools whose schema is short enough for 30 to fit the context), the
right one at a seeded random position. One ``auto`` request per item and arm:

* ``given`` - that order; ``reversed`` - the same list backwards; ``shuffled`` - another
  seeded permutation: together they show the position bias;
* ``ranked`` - the ``given`` list with ``loopstack.tool_rank`` (the server orders them by
  relevance); ``top3`` / ``top5`` - the same, only the k best offered.

``--everyday``: instead of those items, the golden tools' 24 requests worded as a user says
them (`selection_everyday.json`: "Is it raining in Oslo?", "Any new mail?"), each among the
other golden and MCP time tools - the agent's own tools, not the corpus's. They state no
argument values to check: their argument accuracy is their selection accuracy.

**Abstention items** (`loopstack/bench/agent/abstention.json`): requests no offered tool fits (JSON
examples, code, general questions) next to tools that look related; any call is a false call.
Arms (``--abstention-arms``): ``given``; ``given+abstain`` (``loopstack.abstain``: the prompt
says to call a tool only when the request needs one); ``ranked+floor`` (``--min-score``: tools
scoring less are not offered); both. Arms compose: a base (``given``, ``ranked``, ``topK``) and
``+abstain``, ``+floor``, ``+decide`` (``loopstack.decide``: a hidden decision line first);
``defaults`` sends no ``loopstack`` field (what the server gives a plain client); every other
arm states each field, so the server's defaults never mix in. ``+floor`` takes the floor of
``--min-score``, ``+floor0.15`` that value: ``top5+floor+abstain`` is the README's recommended
set (top 5, the floor, the rule), ``top5+abstain`` the same without the floor.

Reported per size and arm: selection accuracy (the first call names the right tool), calls
kept (the share of these requests, which all need a tool, that got a call at all), argument
accuracy (every value the request states is passed exactly: strings equal, numbers equal),
no-call and wrong-tool rates, prompt tokens, step latency; accuracy by the right tool's
position (first, middle or last third); the false-call rate per abstention arm. Identical
requests are sent once (greedy decoding): ``ranked`` on a reversed list is the same request.
Prints JSON lines and a final ``RESULT {...}`` line; ``--out`` keeps rows and summary.
``--rank-only`` runs no model: the server's ranking on the same items (is its order the same
for a given, reversed and shuffled list; the right tool's score; what a floor keeps).
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import typer

from loopstack.bench.commandline import benchmark_app, run_command
from loopstack.bench.common import CORPUS_PATH
from loopstack.bench.corpus.text import humanize

HERE = Path(__file__).parent
GOLDEN_ITEMS = HERE / "selection_golden.json"
ZH_ITEMS = HERE / "selection_zh.json"
EVERYDAY_ITEMS = HERE / "selection_everyday.json"
ABSTENTION = HERE / "abstention.json"
TIME_TOOLS = HERE / "time_tools.json"
Lang = Literal["en", "zh"]
GOLDEN_TOOLS = HERE.parent / "golden"
ARMS = ("given", "reversed", "shuffled", "ranked", "top3", "top5", "top5+floor+abstain")
# Composed arms (also on the abstention set, `--abstention-arms`): a base (given, ranked, topK)
# and modifiers `+abstain`, `+floor` (tool_rank.min_score = --min-score; `+floor0.15`: that
# value), `+decide`
# (loopstack.decide); ``defaults`` sends no loopstack field at all: the server's defaults.
# Every other arm states each selection field, so the server's defaults never mix in.
MODIFIERS = ("abstain", "floor", "decide")
MAX_TOOL_CHARS = 900  # distractors: 30 such tools fit the default model's 8k context


@dataclass(frozen=True)
class Item:
    id: str
    prompt: str
    right: str | None  # None: an abstention item
    expected: dict[str, Any]  # argument values the prompt states
    tools: tuple[dict[str, Any], ...]  # the "given" order
    # the arguments' check where `expected` cannot say it (BFCL's possible answers)
    check: Callable[[dict[str, Any]], bool] | None = None
    group: str = ""  # the set it is from, where items are not grouped by size (BFCL's)


@dataclass
class Row:
    item: str
    size: int
    arm: str
    right: str | None
    position: int  # of the right tool in what was offered (-1: not offered / abstention)
    offered: int
    called: list[str] = field(default_factory=list)
    correct: bool = False
    args_ok: bool | None = None
    prompt_tokens: int = 0
    latency_s: float = 0.0
    error: str = ""
    group: str = ""  # a set's name where items are not grouped by size (loopstack.bench.agent.bfcl)
    arguments: str = ""  # the first call's arguments as the model wrote them (JSON)


# --- items ---------------------------------------------------------------------------------


def expected_values(prompt: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """The values a templated request states (``name "value"``, ``max results 100``), by
    the parameter's humanized name; a name inside a longer one's match does not count."""
    found: list[tuple[int, int, str, Any]] = []
    for name, sub in (parameters.get("properties") or {}).items():
        if not isinstance(sub, dict) or sub.get("type") in ("array", "object"):
            continue
        pat = re.escape(humanize(name)) + r' ("[^"]*"|-?\d+(?:\.\d+)?|true|false)(?=[ ,.?!;]|$)'
        for m in re.finditer(r"(?<![\w-])" + pat, prompt, re.I):
            found.append((m.start(), m.end(), name, json.loads(m.group(1))))
    out: dict[str, Any] = {}
    for start, end, name, value in found:
        inside = any(s <= start and end <= e and (s, e) != (start, end) for s, e, *_ in found)
        if not inside and name not in out:
            out[name] = value
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return float(a) == float(b)
    return bool(a == b)


def golden_tools() -> dict[str, dict[str, Any]]:
    """The golden set's tools (loopstack/bench/golden/tools_*.py) as OpenAI tool objects."""
    from loopstack.agent.tools.registry import load_tools_file

    out: dict[str, dict[str, Any]] = {}
    for path in sorted(GOLDEN_TOOLS.glob("tools_*.py")):
        for t in load_tools_file(path):
            out[t.name] = {
                "type": "function",
                "function": {"name": t.name, "description": t.description,
                             "parameters": t.parameters},
            }  # fmt: skip
    return out


def load_pool() -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    rows = [json.loads(line) for line in CORPUS_PATH.read_text().splitlines() if line.strip()]
    return rows, {r["tool"]["function"]["name"]: r["tool"] for r in rows}


def selection_items(
    n_items: int, size: int, seed: int, lang: Lang = "en", *, everyday: Path | None = None
) -> list[Item]:
    """The golden items (English: `GOLDEN_ITEMS`; Chinese: `ZH_ITEMS`) and, in English, the
    first `n_items` corpus items, each with the right tool among `size` at a seeded position.
    `everyday`: instead, that file's requests for the golden tools as a user words them
    (`EVERYDAY_ITEMS`, or one's own of the same form: ``id``, ``prompt``, ``tool``,
    ``expected``), each among the other golden and time tools (an agent's own tools, not the
    corpus's)."""
    rows, by_name = load_pool()
    golden = golden_tools()
    named = {**by_name, **golden, **time_tools()}  # a look-alike may be any of these
    small = [t for t in [*by_name.values(), *golden.values()] if len(json.dumps(t)) <= 900]
    rng = random.Random(seed)
    candidates = [r for r in rows if len(json.dumps(r["tool"])) <= 1500]
    rng.shuffle(candidates)
    picked: list[tuple[str, str, dict[str, Any], dict[str, Any], list[str]]] = []
    if everyday is not None:
        own = sorted({*golden, *time_tools()})
        for g in json.loads(everyday.read_text()):
            if g["tool"] not in own:
                raise ValueError(
                    f"{everyday}: {g['id']}: {g['tool']!r} is not a golden or time tool"
                )
            near = [n for n in own if n != g["tool"]]
            random.Random(f"{seed}:{g['id']}").shuffle(near)
            picked.append((g["id"], g["prompt"], named[g["tool"]], g["expected"], near))
    else:
        for g in json.loads((ZH_ITEMS if lang == "zh" else GOLDEN_ITEMS).read_text()):
            near = g.get("near", [])
            picked.append((g["id"], g["prompt"], named[g["tool"]], g["expected"], near))
    if lang == "en" and everyday is None:  # the corpus requests are English templates
        for r in candidates[:n_items]:
            params = r["tool"]["function"]["parameters"]
            exp = expected_values(r["prompt"], params)
            picked.append((r["id"], r["prompt"], r["tool"], exp, r.get("distractors", [])))
    items = []
    for iid, prompt, tool, exp, near in picked:
        rng_i = random.Random(f"{seed}:{iid}:{size}")
        name = tool["function"]["name"]
        others = [named.get(n) for n in near]
        chosen = [t for t in others if t is not None and t["function"]["name"] != name]
        pool = [t for t in small if t["function"]["name"] != name]
        rng_i.shuffle(pool)
        for t in pool:
            if len(chosen) >= size - 1:
                break
            if all(t["function"]["name"] != c["function"]["name"] for c in chosen):
                chosen.append(t)
        chosen = chosen[: size - 1]
        rng_i.shuffle(chosen)
        chosen.insert(rng_i.randrange(len(chosen) + 1), tool)
        items.append(Item(f"{iid}@{size}", prompt, name, exp, tuple(chosen)))
    return items


def abstention_items(lang: Lang = "en") -> list[Item]:
    """The 40 requests no offered tool fits, asked in English or (``prompt_zh``) Chinese."""
    golden = golden_tools()
    _, corpus = load_pool()
    items = []
    for i, a in enumerate(json.loads(ABSTENTION.read_text())):
        tools = [golden.get(n) or corpus.get(n) or _inline(n, a) for n in a["tools"]]
        prompt = a["prompt_zh"] if lang == "zh" else a["prompt"]
        items.append(Item(f"abstain-{i:02d}", prompt, None, {}, tuple(tools)))
    return items


def time_tools() -> dict[str, dict[str, Any]]:
    """The MCP time server's two tools as an agent offers them (`mcp-server-time`, its local
    time zone UTC), for the Chinese items that ask the time."""
    return {t["function"]["name"]: t for t in json.loads(TIME_TOOLS.read_text())}


def _inline(name: str, entry: dict[str, Any]) -> dict[str, Any]:
    spec = entry.get("inline", {}).get(name)
    if spec is None:
        raise KeyError(f"abstention item {entry['prompt'][:40]!r}: unknown tool {name!r}")
    return {"type": "function", "function": {"name": name, **spec}}


def arm_request(item: Item, arm: str, seed: int, min_score: float | None) -> tuple[list, dict]:
    """The tools list and the ``loopstack`` extension of one arm."""
    tools = list(item.tools)
    if arm == "defaults":  # nothing said: what a plain client gets
        return tools, {}
    ext: dict[str, Any] = {"tool_rank": None, "abstain": False, "decide": False}
    base, *mods = arm.split("+")
    if base == "reversed":
        tools.reverse()
    elif base == "shuffled":
        random.Random(f"{seed}:shuffle:{item.id}").shuffle(tools)
    elif base == "ranked":
        ext["tool_rank"] = {}
    elif re.fullmatch(r"top\d+", base):
        ext["tool_rank"] = {"top_k": int(base[3:])}
    elif base != "given":
        raise ValueError(f"unknown arm {arm!r}")
    for mod in mods:
        if floor := re.fullmatch(r"floor(\d*\.?\d+)?", mod):
            value = float(floor[1]) if floor[1] else min_score or 0.3
            ext["tool_rank"] = {**(ext["tool_rank"] or {}), "min_score": value}
        elif mod in ("abstain", "decide"):
            ext[mod] = True
        else:
            raise ValueError(f"unknown arm modifier {mod!r} in {arm!r}")
    return tools, ext


def known_arm(arm: str) -> bool:
    try:
        arm_request(Item("x", "", None, {}, ()), arm, 0, None)
    except ValueError:
        return False
    return True


# --- running ---------------------------------------------------------------------------------


async def run_one(
    client: Any, model: str, item: Item, arm: str, tools: list, ext: dict, max_tokens: int
) -> Row:
    names = [t["function"]["name"] for t in tools]
    row = Row(item.id, len(tools), arm, item.right, -1, len(tools), group=item.group)
    body: dict[str, Any] = {"tools": tools}
    if ext:
        body["loopstack"] = ext
    t0 = time.perf_counter()
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model=model,
            messages=[{"role": "user", "content": item.prompt}],
            tool_choice="auto",
            temperature=0,
            max_tokens=max_tokens,
            extra_body=body,
        )
    except Exception as exc:
        row.error = f"{type(exc).__name__}: {str(exc)[:200]}"
        return row
    row.latency_s = round(time.perf_counter() - t0, 3)
    offered = raw.headers.get("x-loopstack-tools-offered")
    if offered is not None:
        names = [n for n in offered.split(",") if n]
    row.offered = len(names)
    row.position = names.index(item.right) if item.right in names else -1
    resp = raw.parse()
    row.prompt_tokens = int(getattr(resp.usage, "prompt_tokens", 0) or 0)
    calls = resp.choices[0].message.tool_calls or []
    row.called = [c.function.name for c in calls]
    if calls:
        row.arguments = calls[0].function.arguments or ""
    if item.right is not None and calls and calls[0].function.name == item.right:
        row.correct = True
        try:
            args = json.loads(calls[0].function.arguments or "{}")
        except json.JSONDecodeError:
            args = {}
        if item.check is not None:
            row.args_ok = isinstance(args, dict) and item.check(args)
        else:
            row.args_ok = all(_same(args.get(k), v) for k, v in item.expected.items())
    return row


def summarize(rows: list[Row]) -> dict[str, Any]:
    out: dict[str, Any] = {"selection": {}, "abstention": {}, "position": {}}
    groups: dict[tuple[bool, int, str, str], list[Row]] = defaultdict(list)
    for r in rows:  # a set (named, or the abstention set) is one, whatever its tools' number
        whole = bool(r.group) or r.right is None
        groups[(r.right is None, 0 if whole else r.size, r.group, r.arm)].append(r)
    for (abstention, size, group, arm), rs in sorted(groups.items()):
        ok = [r for r in rs if not r.error]
        if abstention:
            calls = sum(1 for r in ok if r.called)
            out["abstention"][f"{group}/{arm}" if group else arm] = {
                "n": len(ok),
                "false_calls": calls,
                "false_call_rate": round(calls / len(ok), 3) if ok else None,
                "errors": len(rs) - len(ok),
            }
            continue
        right = [r for r in ok if r.correct]
        out["selection"][f"{group or size}/{arm}"] = {
            "n": len(ok),
            "accuracy": round(len(right) / len(ok), 3) if ok else None,
            # every item needs a tool: the share that still got a call (any tool)
            "calls_kept": round(sum(1 for r in ok if r.called) / len(ok), 3) if ok else None,
            "args_accuracy": round(sum(bool(r.args_ok) for r in ok) / len(ok), 3) if ok else None,
            "no_call": sum(1 for r in ok if not r.called),
            "wrong_tool": sum(1 for r in ok if r.called and not r.correct),
            "not_offered": sum(1 for r in ok if r.position < 0),
            "prompt_tokens_mean": round(statistics.mean(r.prompt_tokens for r in ok)) if ok else 0,
            "latency_p50_s": round(statistics.median(r.latency_s for r in ok), 2) if ok else 0,
            "errors": len(rs) - len(ok),
        }
        if arm in ("given", "reversed", "shuffled") and ok and not group:
            thirds: dict[str, list[bool]] = defaultdict(list)
            for r in ok:
                third = ("first", "middle", "last")[min(2, 3 * r.position // max(r.offered, 1))]
                thirds[third].append(r.correct)
            out["position"][f"{size}/{arm}"] = {
                k: f"{sum(v)}/{len(v)}" for k, v in sorted(thirds.items())
            }
    return out


async def run(args: SimpleNamespace) -> dict[str, Any]:
    jobs: list[tuple[Item, str, list, dict]] = []
    for size in args.sizes:
        for item in selection_items(args.items, size, args.seed, args.lang, everyday=args.everyday):
            for arm in args.arms:
                jobs.append((item, arm, *arm_request(item, arm, args.seed, args.min_score)))
    if args.abstention:
        for item in abstention_items(args.lang)[: args.abstention_limit]:
            for arm in args.abstention_arms:
                tools, ext = arm_request(item, arm, args.seed, args.min_score)
                jobs.append((item, arm, tools, ext))
    rows = await send_all(args, jobs)
    summary = summarize(rows)
    save(args.out, rows, summary)
    return summary


async def send_all(args: SimpleNamespace, jobs: list[tuple[Item, str, list, dict]]) -> list[Row]:
    """One ``auto`` request per job (item, arm, tools, extension), ``args.concurrency`` at a
    time; a request identical to an earlier one (greedy decoding) is answered once."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=args.base_url, api_key=args.api_key, timeout=600, max_retries=0)
    model = args.model or (await client.models.list()).data[0].id
    sem = asyncio.Semaphore(args.concurrency)
    done: dict[str, asyncio.Task[Row]] = {}

    async def one(item: Item, arm: str, tools: list, ext: dict) -> Row:
        key = json.dumps([item.prompt, [t["function"]["name"] for t in tools], ext])
        if key not in done:

            async def send() -> Row:
                async with sem:
                    return await run_one(client, model, item, arm, tools, ext, args.max_tokens)

            done[key] = asyncio.ensure_future(send())
        row = Row(**asdict(await done[key]))
        row.arm = arm
        print(json.dumps(asdict(row)), flush=True)
        return row

    try:
        return list(await asyncio.gather(*(one(*j) for j in jobs)))
    finally:
        await client.close()


def save(out: Path | None, rows: list[Row], summary: dict[str, Any]) -> None:
    """Rows and summary into `out` (``rows.jsonl``, ``summary.json``), when given."""
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "rows.jsonl").write_text("".join(json.dumps(asdict(r)) + "\n" for r in rows))
        (out / "summary.json").write_text(json.dumps(summary, indent=2))


async def rank_only(args: SimpleNamespace) -> dict[str, Any]:
    """No model: the server's ranking (`loopstack.serving.selection.rank`: MiniLM, and
    multilingual-e5 for requests mostly in another script, as the server builds it) on the same
    items."""
    return await rank_report(make_ranker(), args)


def make_ranker() -> Any:
    """A `ToolRanker` as the server builds it (MiniLM; multilingual-e5 where installed)."""
    from loopstack.serving.embeddings import EmbeddingService
    from loopstack.serving.selection.rank import ToolRanker
    from loopstack.serving.selection.requests import MultilingualEmbedder, ServerEmbedder

    multilingual = MultilingualEmbedder() if MultilingualEmbedder.available() else None
    english = ServerEmbedder(EmbeddingService("all-MiniLM-L6-v2"))
    return ToolRanker(english, multilingual=multilingual)


async def rank_report(ranker: Any, args: SimpleNamespace) -> dict[str, Any]:
    """What `ranker` (a `ToolRanker`) does with the items: is its order the same whatever the
    input order, where does the right tool land (first, in the top 3, top 5), and what a
    ``min_score`` floor keeps of the right tools and leaves of the abstention requests, with
    the share of requests the server applies a floor to at all."""
    from loopstack.serving.selection.rank import floor_applies

    same = total = floored = 0
    place: dict[int, list[int]] = {}
    right: list[float] = []
    for size in args.sizes:
        for item in selection_items(args.items, size, args.seed, args.lang, everyday=args.everyday):
            orders = []
            for arm in ("given", "reversed", "shuffled"):
                tools, _ = arm_request(item, arm, args.seed, None)
                orders.append([r.name for r in await ranker.rank(item.prompt, tools)])
            total += 1
            same += all(o == orders[0] for o in orders)
            place.setdefault(size, []).append(orders[0].index(str(item.right)))
            ranking = await ranker.rank(item.prompt, list(item.tools))
            right.append(next(r.score for r in ranking if r.name == item.right))
            floored += floor_applies(item.prompt)
    abstention = abstention_items(args.lang)
    best = [(await ranker.rank(i.prompt, list(i.tools)))[0].score for i in abstention]
    return {
        "same_order_for_given_reversed_shuffled": f"{same}/{total}",
        "right_tool_first": {str(k): f"{sum(p < 1 for p in v)}/{len(v)}" for k, v in place.items()},
        "right_tool_in_top": {
            str(k): {str(n): f"{sum(p < n for p in v)}/{len(v)}" for n in (3, 5)}
            for k, v in place.items()
        },
        "right_tool_score_quantiles": quantiles(right, (0.01, 0.02, 0.05, 0.5)),
        "floor_applies_to": {
            "selection": f"{floored}/{total}",
            "abstention": f"{sum(floor_applies(i.prompt) for i in abstention)}/{len(abstention)}",
        },
        "floor": {
            str(f): {
                "right_kept": round(sum(x >= f for x in right) / len(right), 3),
                "abstention_left_without_tools": round(sum(b < f for b in best) / len(best), 3),
            }
            for f in (0.2, 0.25, 0.3, 0.35, 0.4, 0.5)
        },
    }


def quantiles(values: list[float], qs: tuple[float, ...]) -> dict[str, float]:
    """The `qs` quantiles of `values` (the lower of two neighbours), rounded to 3 places."""
    ordered = sorted(values)
    return {str(q): round(ordered[int(q * (len(ordered) - 1))], 3) for q in qs}


# The options every selection run shares (this bench's and `loopstack.bench.agent.bfcl`'s): the
# server, the sending, the floor of the ``+floor`` arms, the seed, the output folder.
BASE_URL = typer.Option("http://127.0.0.1:8000/v1", "--base-url")
API_KEY = typer.Option("EMPTY", "--api-key")
MODEL = typer.Option(None, "--model")
MIN_SCORE = typer.Option(0.3, "--min-score", help="the +floor arms' floor")
CONCURRENCY = typer.Option(4, "--concurrency")
MAX_TOKENS = typer.Option(256, "--max-tokens")
SEED = typer.Option(7, "--seed")
OUT = typer.Option(None, "--out")
RANK_ONLY = typer.Option(False, "--rank-only", help="no model: the ranking's order and floor")

app = benchmark_app(__doc__)


@app.command()
def selection(
    base_url: str = BASE_URL,
    api_key: str = API_KEY,
    model: str | None = MODEL,
    min_score: float = MIN_SCORE,
    concurrency: int = CONCURRENCY,
    max_tokens: int = MAX_TOKENS,
    seed: int = SEED,
    out: Path | None = OUT,
    rank_only: bool = RANK_ONLY,
    sizes: str = typer.Option("5,10,30", help="tool-set sizes, comma-separated"),
    items: int = typer.Option(12, help="corpus items per size (+ golden)"),
    arms: str = typer.Option(",".join(ARMS), help="comma-separated"),
    abstention: bool = typer.Option(True, "--abstention/--no-abstention"),
    abstention_arms: str = typer.Option(
        "given,given+abstain,ranked+floor,ranked+floor+abstain",
        help="arms on the abstention set (composed: base+abstain+floor+decide, or defaults)",
    ),
    abstention_limit: int | None = typer.Option(None, help="the first N abstention items only"),
    everyday: bool = typer.Option(
        False,
        "--everyday",
        help="the golden tools' 24 requests as a user words them (selection_everyday.json), "
        "each among the other golden and time tools, instead of the golden and corpus items",
    ),
    everyday_file: Path | None = typer.Option(
        None,
        help="--everyday with your own requests: a JSON list of {id, prompt, tool, expected} "
        "as selection_everyday.json, each tool one of the golden or time tools",
    ),
    lang: Literal["en", "zh"] = typer.Option(
        "en",
        help="zh: the 24 Chinese items (selection_zh.json; no corpus items) and the abstention "
        "requests asked in Chinese",
    ),
) -> int:
    return _command(SimpleNamespace(**locals()))


def _command(args: SimpleNamespace) -> int:
    args.sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    args.arms, args.abstention_arms = args.arms.split(","), args.abstention_arms.split(",")
    args.everyday = args.everyday_file or (EVERYDAY_ITEMS if args.everyday else None)
    if args.everyday is not None and not args.everyday.is_file():
        raise typer.BadParameter(f"--everyday-file: no file {args.everyday}")
    if args.rank_only:
        print("RESULT " + json.dumps(asyncio.run(rank_only(args))))
        return 0
    for arm in [*args.arms, *args.abstention_arms]:
        if not known_arm(arm):
            raise typer.BadParameter(
                f"unknown arm {arm!r}: {', '.join(ARMS)}, defaults, or composed with +"
            )
    summary = asyncio.run(run(args))
    print("RESULT " + json.dumps(summary))
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_command(app, argv)


if __name__ == "__main__":
    raise SystemExit(main())
