"""Capture Claude Code's first Messages request (to replay it in measure_prefix.py).

    python capture_claude.py OUT.json

Runs the pinned Claude Code (.npm-clients, `make npm-claude`) against a one-route server that
records the body of its first POST /v1/messages and answers 400, so Claude Code stops. The
body is written to OUT.json (not committed: it is Claude Code's own prompt).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CLAUDE = ROOT / ".npm-clients" / "bin" / "claude"
QUIET = {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
         "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1"}  # fmt: skip
captured: list[bytes] = []


class Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        if self.path.startswith("/v1/messages") and "count_tokens" not in self.path:
            captured.append(body)
        err = json.dumps({"type": "error", "error": {"type": "invalid_request_error",
                                                     "message": "captured"}}).encode()  # fmt: skip
        self.send_response(400)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(err)))
        self.end_headers()
        self.wfile.write(err)

    def log_message(self, *_: object) -> None:
        pass


def main() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = HTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    work = Path(tempfile.mkdtemp(prefix="claude-capture-"))
    (work / "home").mkdir()
    (work / "project").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE"))}
    env.update(QUIET, HOME=str(work / "home"), ANTHROPIC_BASE_URL=f"http://127.0.0.1:{port}",
               ANTHROPIC_AUTH_TOKEN="x", ANTHROPIC_MODEL="served")  # fmt: skip
    subprocess.run([str(CLAUDE), "-p", "List the files here.", "--output-format", "json"],
                   env=env, cwd=work / "project", capture_output=True, timeout=120,
                   stdin=subprocess.DEVNULL)  # fmt: skip
    server.shutdown()
    if not captured:
        sys.exit("Claude Code sent no /v1/messages request")
    Path(sys.argv[1]).write_bytes(captured[0])
    print(f"captured {len(captured[0])} bytes")


if __name__ == "__main__":
    main()
