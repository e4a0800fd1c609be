"""The benchmark scripts (run as ``python bench/NAME.py``; see docs/benchmarks.md) and the modules they share."""
