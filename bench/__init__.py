"""Benchmarks: workloads, the fleet runner, baselines, the oracle, the overhead benchmark and reports."""
