"""Tests of bench/systems/."""
