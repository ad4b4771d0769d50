"""`python -m bench.constraint_cost`: kept only because deploy/gpu-smoke.sh calls this form; the
benchmark is `bench/serving/constraint_cost.py` (`loopstack bench serving ...`)."""

from bench.serving.constraint_cost import main

if __name__ == "__main__":
    raise SystemExit(main())
