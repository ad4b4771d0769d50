"""Tool ranking (loopstack.serving.selection.rank) with the hashing embedder: no model needed."""

from __future__ import annotations

from typing import Any

import pytest

from loopstack.bench.agent.selection import time_tools
from loopstack.memory.embedding import HashingEmbedder
from loopstack.serving.selection.rank import (
    ToolRanker,
    floor_applies,
    latin_share,
    tool_document,
    tool_key,
)


def tool(name: str, description: str, **params: Any) -> dict[str, Any]:
    props = {p: {"type": "string", "description": d} for p, d in params.items()}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": props},
        },
    }


TOOLS = [
    tool("sales_by_product", "Sales broken down by product for a region", region="sales region"),
    tool("get_weather", "Current weather for a city", city="city name"),
    tool("convert_currency", "Convert an amount of money between currencies", amount="amount"),
    tool("read_file", "Read a text file from the workspace", path="file path"),
]


def test_the_document_names_words_description_and_parameters() -> None:
    doc = tool_document(TOOLS[3])
    assert doc.startswith("read file. Read a text file")
    assert "Parameters: path: file path" in doc
    camel = tool_document({"name": "listAllFiles", "description": ""})
    assert camel == "list all files"


async def test_the_relevant_tool_ranks_first_whatever_its_position() -> None:
    ranker = ToolRanker(HashingEmbedder())
    for shift in range(len(TOOLS)):
        tools = TOOLS[shift:] + TOOLS[:shift]
        ranking = await ranker.rank("What is the weather in Paris today?", tools)
        assert ranking[0].name == "get_weather"
        assert [r.name for r in ranking] == sorted(
            (r.name for r in ranking), key=lambda n: -next(x.score for x in ranking if x.name == n)
        )
        assert tools[ranking[0].index]["function"]["name"] == "get_weather"


async def test_tool_vectors_are_cached_by_schema_hash() -> None:
    ranker = ToolRanker(HashingEmbedder())
    await ranker.rank("convert 100 dollars", TOOLS)
    assert ranker.embedded == len(TOOLS)
    await ranker.rank("read notes.txt", list(reversed(TOOLS)))  # same tools: nothing new
    assert ranker.embedded == len(TOOLS)
    changed = tool("get_weather", "Weather forecast for a city, days ahead", city="city")
    assert tool_key(changed) != tool_key(TOOLS[1])
    await ranker.rank("weather", [*TOOLS[:1], changed])
    assert ranker.embedded == len(TOOLS) + 1


async def test_keyword_recall_lifts_an_exact_identifier() -> None:
    tools = [tool(f"report_{i}", "A report about numbers", region="region") for i in range(3)]
    tools.append(tool("north_report", "A report about numbers for North", region="region"))
    ranker = ToolRanker(HashingEmbedder(), keyword_weight=1.0)
    ranking = await ranker.rank("north", tools)
    assert ranking[0].name == "north_report" and ranking[0].keyword == 1.0
    assert all(r.keyword == 0.0 for r in ranking[1:])


async def test_ties_keep_the_given_order_and_nothing_is_not_an_error() -> None:
    ranker = ToolRanker(HashingEmbedder(), keyword_weight=0.0)
    same = [tool("a", "x"), tool("b", "x")]
    same[1]["function"]["name"] = "a"  # identical documents apart from the name's hash
    assert [r.index for r in await ranker.rank("zzz", same)] == [0, 1]
    assert await ranker.rank("anything", []) == []


# --- values' examples, scripts, the multilingual embedder ------------------------------------

# the MCP time server's two tools as an agent offers them (the selection bench's copy)
TIME_TOOLS = list(time_tools().values())


def test_examples_of_values_are_left_out_of_the_document() -> None:
    doc = tool_document(time_tools()["time__convert_time"])
    assert "Tokyo" not in doc and "New_York" not in doc
    assert "Convert time between timezones" in doc and "target timezone: Target IANA" in doc
    assert "(HH:MM)" in doc  # a format is not an example
    stock = tool("quote", "Stock price", symbol="Ticker, for example ACME. Upper case.")
    assert "symbol: Ticker. Upper case." in tool_document(stock)
    calc = tool("calc", "Arithmetic", expression="One expression, such as 12 * (3 + 4).")
    assert tool_document(calc).endswith("expression: One expression.")
    enum = {"name": "f", "parameters": {"properties": {"unit": {"enum": ["c", "f"]}}}}
    assert "unit:  (c, f)" in tool_document(enum)  # admissible values are not examples


def test_latin_share_tells_an_english_request_from_a_chinese_one() -> None:
    assert latin_share("What time is it now in Tokyo?") == 1.0 and floor_applies("")
    assert floor_applies("Quelle est la météo à Paris ?")  # accents: still Latin script
    assert floor_applies("Please read 报告.txt")  # two CJK characters in an English request
    for zh in ("现在东京几点？", "读一下文件 notes/todo.txt，告诉我里面写了什么。"):
        assert not floor_applies(zh), zh
    assert not floor_applies("Какая погода в Москве?")
    assert latin_share("把 250 美元换成英镑。") == 0.0


class Recording(HashingEmbedder):
    """The hashing embedder, noting what it embedded and whether as a query."""

    def __init__(self, *, queries: bool) -> None:
        super().__init__()
        self.seen: list[tuple[str, str]] = []
        if queries:
            self.embed_query = self._query  # type: ignore[method-assign]

    async def embed(self, texts: list[str]) -> Any:
        self.seen += [("doc", t) for t in texts]
        return await super().embed(texts)

    async def _query(self, texts: list[str]) -> Any:
        self.seen += [("query", t) for t in texts]
        return await super().embed(texts)


async def test_a_request_in_another_script_is_ranked_by_the_multilingual_embedder() -> None:
    english, multilingual = Recording(queries=False), Recording(queries=True)
    ranker = ToolRanker(english, multilingual=multilingual)
    await ranker.rank("What is the weather in Paris today?", TOOLS)
    assert multilingual.seen == [] and len(english.seen) == len(TOOLS) + 1
    await ranker.rank("巴黎今天天气怎么样？", TOOLS)
    assert [kind for kind, _ in multilingual.seen] == ["doc"] * len(TOOLS) + ["query"]
    assert len(english.seen) == len(TOOLS) + 1  # its cache is its own: nothing more embedded
    await ranker.rank("伦敦呢？", TOOLS)  # the multilingual cache holds the tools now
    assert multilingual.seen[-1] == ("query", "伦敦呢？")
    assert ranker.embedded == 2 * len(TOOLS)
    alone = ToolRanker(english)  # without one, every request goes to the English embedder
    assert alone.embedder_for("巴黎今天天气怎么样？") is english


@pytest.mark.slow
async def test_the_servers_embedders_rank_the_time_tools_for_a_now_question() -> None:
    """The README's "What time is it now in Tokyo?": `convert_time` ranked first while its
    description carried the example 'Asia/Tokyo' (2026-12-05), and the 0.5B calls the first."""
    from loopstack.serving.embeddings import EmbeddingService
    from loopstack.serving.selection.requests import MultilingualEmbedder, ServerEmbedder

    multilingual = MultilingualEmbedder() if MultilingualEmbedder.available() else None
    ranker = ToolRanker(
        ServerEmbedder(EmbeddingService("all-MiniLM-L6-v2")), multilingual=multilingual
    )
    tools = [*TIME_TOOLS, TOOLS[2]]
    for question in ("What time is it now in Tokyo?", "What is the current time in Tokyo?"):
        assert (await ranker.rank(question, tools))[0].name == "time__get_current_time", question
    if multilingual is not None:
        assert (await ranker.rank("现在东京几点？", tools))[0].name == "time__get_current_time"
