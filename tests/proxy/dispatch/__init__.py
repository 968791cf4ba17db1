"""Tests of proxy/dispatch/."""
