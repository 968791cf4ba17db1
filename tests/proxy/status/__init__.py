"""Tests of proxy/status/."""
