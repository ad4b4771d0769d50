"""`python -m bench.tool_validity`: kept only because deploy/gpu-smoke.sh calls this form; the
benchmark is `bench/serving/tool_validity.py` (`loopstack bench serving ...`)."""

from bench.serving.tool_validity import main

if __name__ == "__main__":
    raise SystemExit(main())
