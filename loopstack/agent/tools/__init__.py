"""Tools: the registry of typed functions, MCP servers and their config, per-tool retries."""
