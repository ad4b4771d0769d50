"""Memory benchmarks (`loopstack bench memory ...`): recall latency and write throughput,
scope isolation, LoCoMo recall quality, and the Postgres backend. They import ``memory``
in-process; ``data/`` is where the LoCoMo file goes (not committed)."""
