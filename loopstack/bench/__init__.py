"""Benchmarks, by subject. Every one is a sub-command of ``loopstack bench``
(`loopstack.bench.cli`).

- ``load/``     the agent load test and capacity plan: HTTP to any OpenAI-compatible URL,
                never imports ``serving`` or ``agent`` (``loopstack bench agents|requests|plan``)
- ``serving/``  tool-call validity, constraint cost and compile time, proxy overhead, soak,
                event-loop safety, requests per turn (``loopstack bench serving ...``)
- ``memory/``   recall latency, scope isolation, LoCoMo recall, Postgres
                (``loopstack bench memory ...``)
- ``corpus/``   the real-world tool-schema corpus and its builder (``loopstack bench corpus build``)
- ``agent/``    the agent loop's own cost with a scripted model (``loopstack bench agent overhead``)
- ``golden/``   the golden agent task set and its checkers (``loopstack bench golden run``)

Top level: ``cli.py``; ``common.py``, the helpers the load test, the serving benchmarks and the
corpus share (corpus loading, the OpenAI client, call parsing, statistics, output).
deploy/gpu-smoke.sh runs them through the CLI too. Results go to ``bench/results/`` (not
committed); the figures that hold today are in docs/benchmarks.md.
"""
