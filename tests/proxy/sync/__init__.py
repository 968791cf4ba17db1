"""Tests of proxy/sync/."""
