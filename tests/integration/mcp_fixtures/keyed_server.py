"""An MCP server (official SDK) that needs its key, as many real ones do.

    python keyed_server.py stdio       lists its tools only when FIXTURE_API_KEY is set;
                                       without it, says so on stderr and lists none
    python keyed_server.py http PORT   streamable HTTP; every request must carry
                                       ``Authorization: Bearer $FIXTURE_TOKEN`` (else 401)

Its ``whoami`` tool reports which of a few variables the process can see, so a test can prove
that only the named variables reach the server.
"""

from __future__ import annotations

import hashlib
import os
import sys
from typing import Any

from mcp.server.mcpserver import MCPServer

app = MCPServer("keyed")
KEY = os.environ.get("FIXTURE_API_KEY")


def whoami() -> dict[str, Any]:
    """Which variables this server process sees (names only, and a digest of the key)."""
    names = ("FIXTURE_API_KEY", "FIXTURE_REGION", "FIXTURE_SECRET_NOT_PASSED")
    return {
        "sees": sorted(n for n in names if n in os.environ),
        "region": os.environ.get("FIXTURE_REGION", ""),
        "key_sha1": hashlib.sha1((KEY or "").encode()).hexdigest()[:8],
    }


def lookup(order_id: str) -> dict[str, str]:
    """Look an order up in the (pretend) remote system the key opens."""
    return {"order_id": order_id, "status": "shipped"}


if KEY:
    app.tool()(whoami)
    app.tool()(lookup)
else:
    print("keyed fixture: FIXTURE_API_KEY is not set; refusing to offer tools", file=sys.stderr)


def serve_http(port: int) -> None:
    import uvicorn

    token = os.environ.get("FIXTURE_TOKEN", "")
    inner = app.streamable_http_app()

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            if not token or headers.get(b"authorization", b"") != f"Bearer {token}".encode():
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [(b"content-type", b"text/plain")],
                    }
                )
                await send({"type": "http.response.body", "body": b"missing or wrong token"})
                return
        await inner(scope, receive, send)

    uvicorn.run(guarded, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "stdio"
    if mode == "http":
        serve_http(int(sys.argv[2]))
    else:
        app.run("stdio")
