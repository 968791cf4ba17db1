"""Tests of bench/workloads/."""
