"""Tests of bench/labs/."""
