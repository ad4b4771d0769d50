"""Tool ranking (serving.selection.rank) with the hashing embedder: no model needed."""

from __future__ import annotations

from typing import Any

from memory.embedding import HashingEmbedder
from serving.selection.rank import ToolRanker, tool_document, tool_key


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
