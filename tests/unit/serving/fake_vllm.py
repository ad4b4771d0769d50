"""A stand-in for vLLM's OpenAI server, run as a real process by the lifecycle tests.

Takes vLLM's ``--port`` and ``--served-model-name``; guards ``/v1`` with ``VLLM_API_KEY`` as
vLLM does; ``/health`` is open. Like vLLM it starts a child ("engine core") in its process
group. Knobs (environment): FAKE_VLLM_DELAY (seconds before listening), FAKE_VLLM_IGNORE_TERM
(ignore SIGTERM), FAKE_VLLM_PIDS (a file to append "<api pid> <core pid>" to).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--served-model-name", default="fake")
    ns, _ = ap.parse_known_args()
    ignore_term = bool(os.environ.get("FAKE_VLLM_IGNORE_TERM"))
    if ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    core = subprocess.Popen(
        [sys.executable, "-c", "import signal,sys,time\n"
         + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore_term else "")
         + "time.sleep(3600)"]
    )  # fmt: skip
    if os.environ.get("FAKE_VLLM_PIDS"):
        with open(os.environ["FAKE_VLLM_PIDS"], "a") as fh:
            fh.write(f"{os.getpid()} {core.pid}\n")
    time.sleep(float(os.environ.get("FAKE_VLLM_DELAY", "0")))
    key = os.environ.get("VLLM_API_KEY")
    name = ns.served_model_name

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, status: int, obj: object) -> None:
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            if self.path.startswith("/v1") and key:
                if self.headers.get("authorization") != f"Bearer {key}":
                    self._send(401, {"error": "Unauthorized"})
                    return False
            return True

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, {})
            elif self._authorized() and self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": name}]})

        def do_POST(self) -> None:
            if not self._authorized():
                return
            length = int(self.headers.get("content-length", 0))
            body = json.loads(self.rfile.read(length) or b"{}")
            if not body.get("stream"):
                self._send(200, {"choices": [{"index": 0, "text": "ok"}], "model": name})
                return
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.end_headers()
            for i in range(int(body.get("max_tokens", 10))):
                chunk = {"choices": [{"index": 0, "text": f"t{i} "}]}
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.flush()
                time.sleep(0.05)
            self.wfile.write(b"data: [DONE]\n\n")

    ThreadingHTTPServer(("127.0.0.1", ns.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
