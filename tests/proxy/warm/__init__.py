"""Tests of proxy/warm/."""
