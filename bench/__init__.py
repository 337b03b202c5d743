"""Benchmarks (``make bench``): figures are measured here, never asserted by tests."""
