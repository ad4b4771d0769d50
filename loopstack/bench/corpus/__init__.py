"""The tool-schema corpus (`tool_schemas.jsonl`, 415 real tools from botocore and MCP
servers) that the serving benchmarks and tests use; `build` rebuilds it offline
(`loopstack bench corpus build`), `text` turns API documentation into tool descriptions."""
