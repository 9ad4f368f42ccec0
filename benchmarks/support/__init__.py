"""Pieces the benchmarks share (not benchmarks themselves: tests/test_benchmarks.py
runs every benchmarks/*.py)."""
