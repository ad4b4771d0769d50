"""Prometheus metrics of our layer. `/metrics` serves these followed by vLLM's own
(``vllm:*`` names: token throughput, TTFT, queue, KV cache), so one scrape sees both."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "loopstack_requests", "HTTP requests by route and status", ["route", "status"],
            registry=r,
        )  # fmt: skip
        self.request_seconds = Histogram(
            "loopstack_request_duration_seconds", "Request latency (to last byte)", ["route"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300), registry=r,
        )  # fmt: skip
        self.inflight = Gauge("loopstack_requests_running", "Requests generating", registry=r)
        self.waiting = Gauge("loopstack_requests_waiting", "Requests queued by us", registry=r)
        self.rejected = Counter("loopstack_requests_rejected", "429s for overload", registry=r)
        self.aborted = Counter(
            "loopstack_requests_aborted", "Generations aborted by client disconnect", registry=r
        )
        self.tool_requests = Counter(
            "loopstack_tool_requests", "Requests that may call tools", ["mode"], registry=r
        )
        self.tool_calls = Counter(
            "loopstack_tool_calls", "Tool calls returned", ["mode", "valid"], registry=r
        )
        self.tool_retries = Counter(
            "loopstack_tool_call_retries", "Regenerations after failed validation", registry=r
        )
        self.auto_switches = Counter(
            "loopstack_auto_constraint_switches",
            "auto mode: free text turned into a constrained call",
            registry=r,
        )
        self.schema_compile_seconds = Histogram(
            "loopstack_schema_compile_seconds",
            "A constraint compiled first, before the engine sees it (a turn's or a client's "
            "grammar; outlines: a schema's regex and its automaton)",
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
