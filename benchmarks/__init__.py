"""Benchmarks (scale figures for reports; never assertions on time)."""
