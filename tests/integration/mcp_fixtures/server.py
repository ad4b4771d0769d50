"""A small MCP server built with the official SDK (`MCPServer`), run as a subprocess by the
MCP tests: `python server.py stdio`, `python server.py http PORT`, or `python server.py garbage`
(answers every line with text that is not JSON-RPC)."""

from __future__ import annotations

import os
import sys
import time

from mcp.server.mcpserver import MCPServer

app = MCPServer("fixture")


@app.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@app.tool()
def add(a: int, b: int) -> dict[str, int]:
    """Add two integers."""
    return {"sum": a + b}


@app.tool()
def sleep(seconds: float) -> str:
    """Block for a while (a tool that hangs)."""
    time.sleep(seconds)
    return "slept"


@app.tool()
def crash() -> str:
    """Exit the server process at once."""
    os._exit(3)


@app.tool()
def fail(reason: str) -> str:
    """Raise an error inside the tool."""
    raise ValueError(reason)


def garbage() -> None:
    for _line in sys.stdin:
        sys.stdout.write("this is not JSON-RPC\n")
        sys.stdout.flush()


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "stdio"
    if mode == "garbage":
        garbage()
    elif mode == "http":
        app.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        app.run("stdio")
