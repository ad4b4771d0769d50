"""BFCL's sets in the selection bench (loopstack.bench.agent.bfcl): its functions as tools, its
argument check (right answers pass, wrong ones fail), the sample, the pinned download, and a run
through the real serving app (scripted engine) so the converted schemas are ones our server
accepts."""

from __future__ import annotations

import hashlib
import json
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import httpx
import pytest

from loopstack.bench.agent import bfcl
from loopstack.bench.agent.selection import Row, summarize

TRIANGLE = {
    "name": "triangle_properties.get",
    "description": "Retrieve the dimensions of a triangle if lengths of three sides are given.",
    "parameters": {
        "type": "dict",
        "properties": {
            "side1": {"type": "integer", "description": "First side."},
            "side2": {"type": "integer", "description": "Second side."},
            "scale": {"type": "float", "description": "Scale.", "default": 1.0, "optional": True},
            "unit": {"type": "string", "description": "Unit of length."},
            "corners": {"type": "tuple", "items": {"type": "string"}, "description": "Names."},
            "style": {
                "type": "dict",
                "properties": {"color": {"type": "string"}, "width": {"type": "integer"}},
            },
            "get_area": {"type": "boolean", "description": "Area too.", "optional": True},
        },
        "required": ["side1", "side2"],
    },
}
CIRCLE = {
    "name": "circle_properties.get",
    "description": "Retrieve the dimensions of a circle if its radius is given.",
    "parameters": {"type": "dict", "properties": {"radius": {"type": "float"}}, "required": []},
}
ACCEPT: dict[str, list[Any]] = {
    "side1": [5],
    "side2": [4],
    "scale": ["", 1.0, 2.0],
    "unit": ["", "cm", "centimeters"],
    "corners": ["", ["A", "B", "C"]],
    "style": ["", {"color": ["red"], "width": ["", 2]}],
    "get_area": ["", True],
}


def test_a_function_becomes_an_openai_tool() -> None:
    tool = bfcl.to_tool(TRIANGLE)
    fn = tool["function"]
    assert fn["name"] == "triangle_properties_get"  # a dot is not allowed in a tool name
    params = fn["parameters"]
    assert params["type"] == "object" and params["required"] == ["side1", "side2"]
    props = params["properties"]
    assert props["scale"] == {"type": "number", "description": "Scale.", "default": 1.0}
    assert props["corners"]["type"] == "array" and props["corners"]["items"] == {"type": "string"}
    assert props["style"]["type"] == "object"
    assert props["style"]["properties"]["width"] == {"type": "integer"}
    assert "optional" not in json.dumps(tool)  # not a JSON Schema keyword
    assert TRIANGLE["parameters"]["type"] == "dict"  # the source is left as it was


@pytest.mark.parametrize(
    "args",
    [
        {"side1": 5, "side2": 4},
        {"side1": 5, "side2": 4, "scale": 2},  # an int where a float is asked
        {"side1": 5, "side2": 4, "unit": "Centimeters"},  # case
        {"side1": 5, "side2": 4, "unit": "c.m"},  # BFCL drops . , / - _ * ^ and spaces
        {"side1": 5, "side2": 4, "corners": ["a", "b", "c"]},
        {"side1": 5, "side2": 4, "style": {"color": "Red"}},  # an optional key left out
        {"side1": 5, "side2": 4, "style": {"color": "red", "width": 2}, "get_area": True},
    ],
)
def test_right_arguments_pass(args: dict[str, Any]) -> None:
    assert bfcl.args_ok(TRIANGLE, ACCEPT, args)


@pytest.mark.parametrize(
    "args",
    [
        {"side1": 5},  # a required argument missing
        {"side1": 5, "side2": 3},  # a wrong value
        {"side1": "5", "side2": 4},  # a string for an integer
        {"side1": 5.0, "side2": 4},  # a float for an integer
        {"side1": True, "side2": 4},  # a boolean for an integer
        {"side1": 5, "side2": 4, "unit": "inches"},
        {"side1": 5, "side2": 4, "corners": ["C", "B", "A"]},  # order matters
        {"side1": 5, "side2": 4, "corners": ["A", "B"]},
        {"side1": 5, "side2": 4, "style": {"color": "blue"}},
        {"side1": 5, "side2": 4, "style": {"color": "red", "depth": 1}},  # a key not asked for
        {"side1": 5, "side2": 4, "get_area": False},
        {"side1": 5, "side2": 4, "perimeter": True},  # a parameter the function has not
    ],
)
def test_wrong_arguments_fail(args: dict[str, Any]) -> None:
    assert not bfcl.args_ok(TRIANGLE, ACCEPT, args)


def test_an_answer_that_is_not_optional_must_be_given() -> None:
    accept = {**ACCEPT, "unit": ["cm"]}
    assert not bfcl.args_ok(TRIANGLE, accept, {"side1": 5, "side2": 4})
    assert not bfcl.args_ok(TRIANGLE, accept, {"side1": 5, "side2": 4, "unit": ""})
    assert bfcl.args_ok(TRIANGLE, accept, {"side1": 5, "side2": 4, "unit": "cm"})


def test_an_empty_string_is_a_string_left_out() -> None:
    """As BFCL reads it: "" among the answers of a string means it may be left out, and an
    empty string written for it says the same ({"team": ""} for a player of no team named)."""
    assert bfcl.args_ok(TRIANGLE, ACCEPT, {"side1": 5, "side2": 4, "unit": ""})
    assert not bfcl.args_ok(TRIANGLE, ACCEPT, {"side1": 5, "side2": 4, "scale": ""})  # a float


def _write(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _user(text: str) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": text}]]


@pytest.fixture()
def data(tmp_path: Path) -> Path:
    """A data folder in BFCL's layout: 3 multiple items (one of two user turns), 2 irrelevant."""
    d = tmp_path / "data"
    multiple = [
        {"id": "multiple_0", "question": _user("Triangle with sides 5 and 4?"),
         "function": [TRIANGLE, CIRCLE]},
        {"id": "multiple_1", "question": _user("Circle of radius 2?"),
         "function": [CIRCLE, TRIANGLE]},
        {"id": "multiple_2", "question": [[{"role": "user", "content": "a"},
                                           {"role": "user", "content": "b"}]],
         "function": [CIRCLE]},
    ]  # fmt: skip
    answers = [
        {"id": "multiple_0", "ground_truth": [{"triangle_properties.get": ACCEPT}]},
        {"id": "multiple_1", "ground_truth": [{"circle_properties.get": {"radius": [2.0]}}]},
        {"id": "multiple_2", "ground_truth": [{"circle_properties.get": {"radius": [1.0]}}]},
    ]
    irrelevance = [
        {"id": "irrelevance_0", "question": _user("Who wrote Hamlet?"), "function": [CIRCLE]},
        {"id": "irrelevance_1", "question": _user("A poem, please."), "function": [TRIANGLE]},
    ]
    _write(d / "BFCL_v4_multiple.json", multiple)
    _write(d / "possible_answer" / "BFCL_v4_multiple.json", answers)
    _write(d / "BFCL_v4_irrelevance.json", irrelevance)
    return d


def test_items_are_a_seeded_sample_of_one_user_turn(data: Path) -> None:
    got = bfcl.items(data, "multiple", 10, seed=7)
    assert sorted(i.id for i in got) == ["multiple_0", "multiple_1"]  # multiple_2: two turns
    assert [i.id for i in got] == [i.id for i in bfcl.items(data, "multiple", 10, seed=7)]
    by_id = {i.id: i for i in got}
    tri = by_id["multiple_0"]
    assert tri.right == "triangle_properties_get" and tri.group == "multiple"
    assert [t["function"]["name"] for t in tri.tools] == [
        "triangle_properties_get", "circle_properties_get"]  # fmt: skip
    assert tri.check is not None
    assert tri.check({"side1": 5, "side2": 4}) and not tri.check({"side1": 4, "side2": 5})
    assert len(bfcl.items(data, "multiple", 1, seed=7)) == 1
    irr = bfcl.items(data, "irrelevance", 10, seed=7)
    assert len(irr) == 2 and all(i.right is None and i.check is None for i in irr)


def test_the_summary_keeps_a_set_together_whatever_its_number_of_tools() -> None:
    rows = [
        Row("m0", 2, "given", "t", 0, 2, ["t"], True, True, group="multiple"),
        Row("m1", 4, "given", "t", 0, 4, ["t"], True, False, group="multiple"),
        Row("m2", 3, "given", "t", 0, 3, [], group="multiple"),
        Row("i0", 1, "given", None, -1, 1, ["u"], group="irrelevance"),
        Row("i1", 1, "given", None, -1, 1, [], group="irrelevance"),
    ]
    s = summarize(rows)
    g = s["selection"]["multiple/given"]
    assert (g["n"], g["accuracy"], g["args_accuracy"], g["calls_kept"]) == (3, 0.667, 0.333, 0.667)
    assert s["abstention"]["irrelevance/given"]["false_calls"] == 1
    assert s["position"] == {}


def _fake_wheel(folder: Path, files: list[str]) -> Path:
    wheel = folder / bfcl.WHEEL
    with zipfile.ZipFile(wheel, "w") as z:
        for f in files:
            z.writestr(f"bfcl_eval/data/{f}", '{"id": "x"}\n')
    return wheel


def test_fetch_checks_the_wheels_sha256(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    files = [f for name in bfcl.SETS for f in bfcl._files(name)]
    made: list[bytes] = []

    def pip(cmd: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd
        assert cmd[-1] == f"bfcl-eval=={bfcl.VERSION}"
        made.append(_fake_wheel(Path(cmd[cmd.index("-d") + 1]), files).read_bytes())
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(bfcl.subprocess, "run", pip)
    dest = tmp_path / "cache" / bfcl.VERSION
    with pytest.raises(SystemExit, match="sha256"):  # not the published wheel
        bfcl.fetch(dest)
    assert not dest.exists()
    monkeypatch.setattr(bfcl, "WHEEL_SHA256", hashlib.sha256(made[0]).hexdigest())
    assert bfcl.fetch(dest) == dest
    assert all((dest / f).is_file() for f in files) and len(made) == 2
    assert bfcl.fetch(dest) == dest and len(made) == 2  # kept: not fetched again


async def test_a_run_through_the_real_server(
    monkeypatch: pytest.MonkeyPatch, data: Path, tmp_path: Path
) -> None:
    """The converted tools pass our server's validation and constraint; a scripted call of the
    right tool with right values is right on both counts, the irrelevant requests answered in
    text count no false call."""
    import openai

    from tests.unit.serving.serving_fakes import Harness
    from tests.unit.serving.serving_helpers import call

    h = Harness()
    scripted = {  # the right tool with the right values; the right tool with a wrong one
        "multiple_1": call("circle_properties_get", {"radius": 2}),
        "multiple_0": call("triangle_properties_get", {"side1": 5, "side2": 3}),
    }
    order = [i.id for i in bfcl.items(data, "multiple", 40, seed=7)]  # as they are sent
    h.engine.constrained = [f"<tool_call>\n{scripted[i]}\n</tool_call>" for i in order]
    h.engine.constrained.append("I cannot help with that.")  # the irrelevant ones
    transport = httpx.ASGITransport(app=h.app)
    real = openai.AsyncOpenAI

    def client(**kw: Any) -> openai.AsyncOpenAI:
        return real(**kw, http_client=httpx.AsyncClient(transport=transport))

    monkeypatch.setattr(openai, "AsyncOpenAI", client)
    out = tmp_path / "out"
    args = ["--base-url", "http://loopstack.test/v1", "--data", str(data), "--concurrency", "1"]
    await bfcl.run(bfcl.parse_args([*args, "--arms", "given", "--out", str(out)]))
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert not [r for r in rows if r["error"]], rows
    by_id = {r["item"]: r for r in rows}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["source"]["bfcl_eval"] == bfcl.VERSION
    assert by_id["multiple_1"]["correct"] is True and by_id["multiple_1"]["args_ok"] is True
    assert by_id["multiple_0"]["correct"] is True and by_id["multiple_0"]["args_ok"] is False
    assert json.loads(by_id["multiple_0"]["arguments"]) == {"side1": 5, "side2": 3}  # kept
    assert summary["selection"]["multiple/given"]["args_accuracy"] == 0.5
    assert summary["abstention"]["irrelevance/given"]["false_calls"] == 0
    await h.client.aclose()
