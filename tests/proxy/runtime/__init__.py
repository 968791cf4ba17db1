"""Tests of proxy/runtime/."""
