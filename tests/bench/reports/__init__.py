"""Tests of bench/reports/."""
