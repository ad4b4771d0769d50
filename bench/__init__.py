"""Benchmarks for the serving layer (see docs/bench-serving.md)."""
