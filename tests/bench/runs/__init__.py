"""Tests of bench/runs/."""
