"""Benchmarks: `make bench` (python -m bench). They print numbers; nothing here asserts timings."""
