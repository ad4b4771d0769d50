"""Parsing, aggregation and end-to-end runs of the serving benches against a fake
OpenAI-compatible server (httpx.MockTransport: no sockets, no model)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI

from loopstack.bench import common as _client
from loopstack.bench.serving import constraint_cost, proxy_overhead, tool_validity

try:  # the openai client builds on httpx2 in recent releases, on httpx before
    import httpx2 as httpx  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover
    import httpx  # type: ignore[no-redef,unused-ignore]

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city"],
}
SCHEMAS = {"weather": SCHEMA, "other": {"type": "object", "properties": {}}}


# ---------------------------------------------------------------------------
# pure helpers


def test_check_call_cases() -> None:
    ok = _client.check_call("weather", '{"city": "Oslo", "days": 3}', "weather", SCHEMAS)
    assert ok.parses and ok.valid and ok.right_name and ok.error is None
    bad_json = _client.check_call("weather", '{"city": "Oslo"', "weather", SCHEMAS)
    assert not bad_json.parses and not bad_json.valid
    out_of_range = _client.check_call("weather", '{"city": "Oslo", "days": 9}', "weather", SCHEMAS)
    assert out_of_range.parses and not out_of_range.valid
    assert "days" in (out_of_range.error or "")
    missing = _client.check_call("weather", "{}", "weather", SCHEMAS)
    assert not missing.valid
    wrong = _client.check_call("other", "{}", "weather", SCHEMAS)
    assert wrong.valid and not wrong.right_name
    unknown = _client.check_call("nope", "{}", "weather", SCHEMAS)
    assert unknown.parses and not unknown.valid
    as_dict = _client.check_call("weather", {"city": "Rome"}, "weather", SCHEMAS)
    assert as_dict.valid


def test_calls_from_text() -> None:
    tagged = 'x <tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    assert _client.calls_from_text(tagged) == [("weather", {"city": "Oslo"})]
    fenced = 'Sure:\n```json\n{"name": "weather", "parameters": {"city": "Rome"}}\n```'
    assert _client.calls_from_text(fenced) == [("weather", {"city": "Rome"})]
    stringy = '{"name": "weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}'
    assert _client.calls_from_text(stringy) == [("weather", {"city": "Oslo"})]
    assert _client.calls_from_text("no call here {not json}") == []
    assert _client.calls_from_text(None) == []
    unclosed = '<tool_call>{"name": "a", "arguments": {}}'
    assert _client.calls_from_text(unclosed) == [("a", {})]


def test_percentile_and_bootstrap() -> None:
    assert _client.percentile([3, 1, 2], 50) == 2
    assert _client.percentile([0, 10], 90) == pytest.approx(9)
    assert math.isnan(_client.percentile([], 50))
    point, lo, hi = _client.bootstrap_ratio([2, 4, 6], [1, 2, 3])
    assert point == pytest.approx(2) and lo == pytest.approx(2) and hi == pytest.approx(2)
    point, lo, hi = _client.bootstrap_ratio([1.0, 1.1, 0.9, 1.2], [1.0, 1.0, 1.0, 1.0])
    assert lo <= point <= hi
    assert all(math.isnan(x) for x in _client.bootstrap_ratio([], []))


def test_write_json_turns_nan_into_null(tmp_path: Path) -> None:
    _client.write_json(tmp_path / "a" / "r.json", {"x": math.nan, "y": [1.0, math.inf]})
    assert json.loads((tmp_path / "a" / "r.json").read_text()) == {"x": None, "y": [1.0, None]}


def test_pick_spread() -> None:
    items = list(range(10))
    assert _client.pick_spread(items, 5) == [0, 2, 4, 6, 8]
    assert _client.pick_spread(items, 20) == items
    assert _client.pick_spread(items, 0) == []


ENTRY = {
    "id": "t-1",
    "source": "test",
    "tool": {"type": "function", "function": {"name": "weather", "parameters": SCHEMA}},
    "prompt": "Weather in Oslo for 3 days?",
    "distractors": ["other"],
}
OTHER = {
    "id": "t-2",
    "source": "test",
    "tool": {
        "type": "function",
        "function": {"name": "other", "parameters": SCHEMAS["other"], "description": "x"},
    },
    "prompt": "Do the other thing.",
    "distractors": ["weather"],
}


def test_request_kwargs() -> None:
    index = _client.tool_index([ENTRY, OTHER])
    con = tool_validity.request_kwargs(ENTRY, "named", "constrained", index, "m", 64, 0.0, None)
    assert con["tool_choice"] == {"type": "function", "function": {"name": "weather"}}
    assert [t["function"]["name"] for t in con["tools"]] == ["weather", "other"]
    assert "extra_body" not in con
    unc = tool_validity.request_kwargs(ENTRY, "auto", "unconstrained", index, "m", 64, 0.0, 1)
    assert unc["extra_body"] == {"loopstack": {"constrained": False}}
    assert unc["tool_choice"] == "auto" and unc["seed"] == 1


def _msg(name: str | None, args: str | None, content: str | None = None) -> dict:
    calls = (
        []
        if name is None
        else [{"id": "c", "type": "function", "function": {"name": name, "arguments": args}}]
    )
    return {"role": "assistant", "content": content, "tool_calls": calls}


def test_evaluate_and_summarize() -> None:
    recs = [
        tool_validity.evaluate_response(
            ENTRY,
            "required",
            "constrained",
            _msg("weather", '{"city": "Oslo"}'),
            "tool_calls",
            SCHEMAS,
        ),
        tool_validity.evaluate_response(
            ENTRY, "required", "constrained", _msg("other", "{}"), "tool_calls", SCHEMAS
        ),
        tool_validity.evaluate_response(
            ENTRY, "required", "unconstrained", _msg("weather", '{"days": 2}'), "stop", SCHEMAS
        ),
        tool_validity.evaluate_response(
            ENTRY,
            "required",
            "unconstrained",
            _msg(None, None, '```json\n{"name": "weather", "arguments": {"city": "X"}}\n```'),
            "stop",
            SCHEMAS,
        ),
        {
            "id": "t-1",
            "mode": "required",
            "arm": "unconstrained",
            "status": "http_error",
            "error": "HTTP 500: boom",
        },
    ]
    s = tool_validity.summarize(recs)["required"]
    con, unc = s["constrained"], s["unconstrained"]
    assert con["prompts"] == 2 and con["calls_produced"] == 2 and con["valid"] == 2
    assert con["right_name"] == 1 and con["valid_and_right"] == 1
    assert con["valid_per_call"] == 1.0 and con["call_rate"] == 1.0
    assert unc["prompts"] == 3 and unc["http_errors"] == 1 and unc["answered"] == 2
    assert unc["calls_produced"] == 1 and unc["parses"] == 1 and unc["valid"] == 0
    assert unc["valid_per_prompt"] == 0.0 and unc["call_rate"] == pytest.approx(1 / 3)
    assert unc["text_calls"] == 1 and unc["text_calls_valid"] == 1
    assert unc["error_messages"] == {"HTTP 500: boom": 1}


def test_summarize_pairs_and_rounds() -> None:
    def res(rate: float, ttft: float, toks: int = 10) -> dict[str, Any]:
        return {
            "ok": True,
            "decode_rate": rate,
            "e2e_rate": rate,
            "ttft": ttft,
            "completion_tokens": toks,
        }

    pairs = [
        {"id": "tool:a", "constrained": res(8, 0.2), "unconstrained": res(10, 0.1)},
        {"id": "tool:b", "constrained": res(8, 0.2), "unconstrained": res(10, 0.1)},
        {"id": "rf:c", "constrained": {"ok": False}, "unconstrained": res(10, 0.1)},
    ]
    s = constraint_cost.summarize_pairs(pairs)
    assert s["pairs"] == 3 and s["ok_pairs"] == 2
    assert s["decode_rate"]["ratio_of_medians"] == pytest.approx(0.8)
    assert s["ttft"]["paired_ratio_median"] == pytest.approx(2.0)

    def rnd(target: str, wall: float, ttft: float) -> dict[str, Any]:
        req = {"ok": True, "completion_tokens": 64, "ttft": ttft, "decode_rate": 9.0}
        return {
            "concurrency": 2,
            "round": 0,
            "target": target,
            "wall": wall,
            "requests": [req, req],
        }

    out = proxy_overhead.summarize_rounds([rnd("ours", 16.0, 0.3), rnd("raw", 12.8, 0.2)])
    level = out["2"]
    assert level["raw"]["throughput_tok_s"] == pytest.approx(10.0)
    assert level["ratio"]["throughput_ours_over_raw"] == pytest.approx(0.8)
    assert level["ratio"]["ttft_p50_ours_over_raw"] == pytest.approx(1.5)
    assert proxy_overhead.round_order(1, ["ours", "raw"]) == ["raw", "ours"]


# ---------------------------------------------------------------------------
# whole runs against a fake server


class FakeServer:
    """Answers /models and /chat/completions like a tiny OpenAI-compatible server."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.requests: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.fail:
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.path.endswith("/models"):
            return httpx.Response(
                200,
                json={
                    "object": "list",
                    "data": [
                        {"id": "fake-model", "object": "model", "created": 0, "owned_by": "t"}
                    ],
                },
            )
        body = json.loads(request.content)
        self.requests.append(body)
        constrained = body.get("loopstack", {}).get("constrained", True) is not False
        name = None
        if body.get("tools"):
            choice = body.get("tool_choice")
            name = (
                choice["function"]["name"]
                if isinstance(choice, dict)
                else body["tools"][0]["function"]["name"]
            )
        args = '{"city": "Oslo", "days": 3}' if constrained else '{"city": "Oslo", "days": 30}'
        if body.get("stream"):
            return self._stream(name, args, body)
        if name is None or (not constrained and body.get("tool_choice") == "auto"):
            msg: dict[str, Any] = {"role": "assistant", "content": "I cannot.", "tool_calls": None}
        else:
            msg = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": name, "arguments": args},
                    }
                ],
            }
        return httpx.Response(
            200,
            json={
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": msg,
                        "finish_reason": "tool_calls" if msg["tool_calls"] else "stop",
                    }
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12},
            },
        )

    def _stream(self, name: str | None, args: str, body: dict[str, Any]) -> httpx.Response:
        n = int(body.get("max_tokens") or 8)

        def chunk(delta: dict[str, Any], finish: str | None = None, usage: Any = None) -> str:
            c = {
                "id": "x",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": "fake-model",
                "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            if usage:
                c["usage"] = usage
            return "data: " + json.dumps(c) + "\n\n"

        parts = [chunk({"role": "assistant", "content": ""})]
        if name:
            parts.append(
                chunk(
                    {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "c",
                                "type": "function",
                                "function": {"name": name, "arguments": args},
                            }
                        ]
                    }
                )
            )
        else:
            parts += [chunk({"content": "tok "}) for _ in range(n)]
        parts.append(chunk({}, "stop"))
        parts.append(
            chunk({}, usage={"prompt_tokens": 3, "completion_tokens": n, "total_tokens": n + 3})
        )
        parts.append("data: [DONE]\n\n")
        return httpx.Response(
            200, content="".join(parts).encode(), headers={"content-type": "text/event-stream"}
        )


def _patch(monkeypatch: pytest.MonkeyPatch, module: Any, server: FakeServer) -> None:
    def make(base_url: str, api_key: str, timeout: float = 60.0) -> AsyncOpenAI:
        http = httpx.AsyncClient(transport=httpx.MockTransport(server))
        return AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http, max_retries=0)  # type: ignore[arg-type,unused-ignore]

    monkeypatch.setattr(_client, "make_client", make)  # what `connect` builds
    if hasattr(module, "make_client"):
        monkeypatch.setattr(module, "make_client", make)


@pytest.fixture()
def corpus_file(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(json.dumps(e) for e in (ENTRY, OTHER)) + "\n")
    return path


def test_tool_validity_run(
    monkeypatch: pytest.MonkeyPatch,
    corpus_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = FakeServer()
    _patch(monkeypatch, tool_validity, server)
    out = tmp_path / "tv.json"
    rc = tool_validity.main(
        ["--corpus", str(corpus_file), "--out", str(out), "--concurrency", "2", "--progress", "0"]
    )
    assert rc == 0
    data = json.loads(out.read_text())
    assert len(data["records"]) == 2 * 3 * 2
    req = data["summary"]["required"]
    # "weather": constrained valid, unconstrained days=30 out of range; "other": {} always valid
    assert req["constrained"]["valid"] == 2
    assert req["unconstrained"]["valid"] == 1
    assert data["summary"]["auto"]["unconstrained"]["calls_produced"] == 0
    assert data["config"]["model"] == "fake-model"
    assert sum("loopstack" in r for r in server.requests) == 6
    assert "valid/prompts" in capsys.readouterr().out


def test_tool_validity_transport_failure(
    monkeypatch: pytest.MonkeyPatch, corpus_file: Path
) -> None:
    _patch(monkeypatch, tool_validity, FakeServer(fail=True))
    assert tool_validity.main(["--corpus", str(corpus_file), "--progress", "0"]) == 2


def test_constraint_cost_run(
    monkeypatch: pytest.MonkeyPatch, corpus_file: Path, tmp_path: Path
) -> None:
    server = FakeServer()
    _patch(monkeypatch, constraint_cost, server)
    out = tmp_path / "cc.json"
    rc = constraint_cost.main(
        [
            "--corpus",
            str(corpus_file),
            "--tool-prompts",
            "1",
            "--rf-prompts",
            "1",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["summary"]["all"]["ok_pairs"] == 2
    rf = [r for r in server.requests if "response_format" in r]
    assert rf and rf[0]["response_format"]["type"] == "json_schema"
    assert all(r["stream"] for r in server.requests)


def test_proxy_overhead_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    server = FakeServer()
    _patch(monkeypatch, proxy_overhead, server)
    out = tmp_path / "po.json"
    rc = proxy_overhead.main(
        ["--concurrency", "1,2", "--rounds", "2", "--max-tokens", "5", "--out", str(out)]
    )
    assert rc == 0
    data = json.loads(out.read_text())
    assert set(data["summary"]) == {"1", "2"}
    assert data["summary"]["2"]["ours"]["completion_tokens"] == 2 * 2 * 5
    assert all(r.get("ignore_eos") is True for r in server.requests)
    assert all("tools" not in r for r in server.requests)


def test_tool_validity_merge_replaces_rerun_records(tmp_path: Path) -> None:
    from loopstack.bench.serving.tool_validity import merge

    def rec(i: str, status: str) -> dict[str, Any]:
        r: dict[str, Any] = {"id": i, "mode": "required", "arm": "constrained"}
        if status == "ok":
            return r | {"status": "ok", "n_calls": 1, "valid": True, "parses": True}
        return r | {"status": "http_error", "error": "HTTP 503"}

    base, rerun, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "m.json"
    base.write_text(json.dumps({"records": [rec("x", "ok"), rec("y", "lost")]}))
    rerun.write_text(json.dumps({"records": [rec("y", "ok"), rec("z", "ok")]}))
    assert merge([str(base), str(rerun)], str(out)) == 0
    s = json.loads(out.read_text())["summary"]["required"]["constrained"]
    assert (s["prompts"], s["http_errors"], s["valid"]) == (2, 0, 2)
