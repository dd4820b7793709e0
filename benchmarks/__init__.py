"""Benchmarks of linearrag_torch (run ``python -m benchmarks.quality --help``)."""
