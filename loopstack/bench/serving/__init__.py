"""Serving benchmarks: tool-call validity, constraint cost and compile time, proxy overhead,
soak, event-loop safety, engine requests per tool-call turn. They import `serving`
(in-process) or talk HTTP to a server."""
