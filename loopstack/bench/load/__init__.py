"""Agent-level load test and capacity plan (`loopstack bench agents|requests|plan`).

A black box: everything here talks HTTP to an OpenAI-compatible endpoint and never imports
``serving`` or ``agent``.  Modules, by noun:

- ``scenario``  the scenario file (tasks, tools, latency distributions, trace replay)
- ``target``    the ``Target`` protocol and the OpenAI-compatible streaming target
- ``metrics``   step/task records, level summaries, Prometheus prefix-cache counters
- ``scheduler`` closed loop (N agents) and open loop (Poisson arrivals), warmup, saturation
- ``plan``      highest concurrency under an SLO and replicas for N agents
- ``commands``  the ``plan`` and ``pauses`` commands of ``loopstack bench`` (registered by
  ``loopstack.bench.cli``)
- ``result``    the ``RunResult`` tree every output reads, its JSON and the summary line
- ``report``    writes every output: ``report_csv``, ``report_plots`` (PNG), ``report_html``
- ``requests``  request-level figures from ``vllm bench serve`` (run in a subprocess)
- ``runner``    the sweep: arms (ours, baseline, unconstrained) interleaved per level
- ``process_cpu`` CPU seconds by process of a server during a run (snapshot, diff)

The GPU fleet plan (``bench plan --hardware``), modelled - no GPU runs here:

- ``hardware``  datasheet profiles (H100, H200, A100, L40S, B200, ...)
- ``architecture`` a model's config.json (shipped ones under ``data/architectures``)
- ``roofline``  one iteration's roofline terms and the coefficients fitted on them
- ``replica``   one replica's steady state under a request stream (TTFT, TPOT, e2e)
- ``kvcache``   KV capacity and the prefix cache under paused agents (the cliff)
- ``workload``  the workload file: closed-loop agents or open-loop requests
- ``gpuplan``   replicas for N agents, the binding limit, cost, the cliff plot
- ``published`` the check against published GPU runs, BLIS's coefficients beside it

Exceptions: ``BenchError`` is the root; ``ScenarioError`` (bad scenario or trace file)
and ``TargetError`` (the endpoint cannot be reached at all) derive from it.
"""

from __future__ import annotations


class BenchError(Exception):
    """Root of the agent-bench exceptions.

    BenchError
    ├── ScenarioError   bad scenario file or trace file
    └── TargetError     the endpoint cannot be reached / lists no model
    """


class ScenarioError(BenchError):
    pass


class TargetError(BenchError):
    pass
