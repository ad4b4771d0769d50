"""The real server process (app, routes, chat service, guidance backend, uvicorn) over a
scripted engine transport, for the real clients' protocol tests (tests/clients/test_*):
everything a client meets is the product's code; only the model's text is scripted.

    python -m tests.clients.scripted_server --port 8123 --script script.json [--api-key K]

The script (JSON): ``turns`` - what the model writes on each tool turn, chosen by how many
tool results the conversation already holds (turn 0: none yet, so an agent that calls a tool
and sends its output back gets turn 1 next; the last turn repeats); ``chat`` - the answer of
requests without tools (a JSON text for ``text.format``/``output_type`` tasks). Every engine
request is appended to ``--log`` (one JSON object a line) so a test can see what the client
sent back."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

import uvicorn

from tests.unit.serving.serving_fakes import FakeEngine, FakeTokenizer

TOOL_TURN = "<|im_start|>tool\n"


class ScriptedEngine(FakeEngine):
    """FakeEngine whose constrained answer depends on the conversation, not on the count of
    requests (clients may send extra ones)."""

    def __init__(self, turns: list[str], chat: str, log: Path | None) -> None:
        super().__init__()
        self.turns = turns
        self.chat_content = chat
        self.log = log

    def _next(self, body: dict[str, Any]) -> str:
        done = str(body.get("prompt", "")).count(TOOL_TURN)
        return self.turns[min(done, len(self.turns) - 1)]

    async def _enter(self, path: str, body: dict[str, Any]) -> None:
        if self.log is not None:
            with self.log.open("a") as fh:
                fh.write(json.dumps({"path": path, "body": body}) + "\n")
        await super()._enter(path, body)


def build(turns: list[str], chat: str, *, log: Path | None, api_key: str | None) -> Any:
    from loopstack.serving.constraint.factory import make_backend
    from loopstack.serving.embeddings import EmbeddingService
    from loopstack.serving.http.admission import Admission
    from loopstack.serving.http.app import AppState, build_app
    from loopstack.serving.http.service import ChatService
    from loopstack.serving.metrics import Metrics
    from loopstack.serving.prompt import PromptBuilder

    engine = ScriptedEngine(turns, chat, log)
    metrics = Metrics()
    backend = make_backend("guidance", None, mode="thread", metrics=metrics)
    chat_service = ChatService(
        engine,  # type: ignore[arg-type]
        PromptBuilder(FakeTokenizer(), max_model_len=32_768),
        metrics=metrics,
        backend=backend,
    )
    state = AppState(
        engine=engine,  # type: ignore[arg-type]
        chat=chat_service,
        embeddings=EmbeddingService("all-MiniLM-L6-v2"),
        metrics=metrics,
        admission=Admission(metrics, max_running=8, max_waiting=8, retry_after_s=1),
        model_name="scripted",
        api_key=api_key,
        max_model_len=32_768,
    )
    return build_app(state)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--script", type=Path, required=True)
    ap.add_argument("--log", type=Path)
    ap.add_argument("--api-key")
    ns = ap.parse_args()
    script = json.loads(ns.script.read_text())
    app = build(script["turns"], script.get("chat", "Done."), log=ns.log, api_key=ns.api_key)
    logging.basicConfig(level=logging.WARNING)
    uvicorn.run(app, host="127.0.0.1", port=ns.port, log_level="warning")


if __name__ == "__main__":
    main()


class Launched:
    """A scripted server started by `launch` (a context manager: stopped on exit)."""

    def __init__(self, script: dict[str, Any], folder: Path, *, api_key: str | None) -> None:
        import subprocess
        import sys
        import time

        import httpx

        from tests.ports import free_port

        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.log = folder / "engine.jsonl"
        path = folder / "script.json"
        path.write_text(json.dumps(script))
        argv = [sys.executable, "-m", "tests.clients.scripted_server", "--port", str(self.port),
                "--script", str(path), "--log", str(self.log)]  # fmt: skip
        if api_key:
            argv += ["--api-key", api_key]
        root = Path(__file__).resolve().parents[2]
        self.proc = subprocess.Popen(argv, cwd=root, stdout=subprocess.DEVNULL,
                                     stderr=(folder / "server.err").open("wb"))  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError((folder / "server.err").read_text()[-2000:])
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=1).is_success:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("the scripted server did not come up in 60 s")

    def requests(self) -> list[dict[str, Any]]:
        """Every engine request so far (path, body)."""
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except Exception:
            self.proc.kill()

    def __enter__(self) -> Launched:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
