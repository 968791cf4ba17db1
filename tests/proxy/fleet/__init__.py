"""Tests of proxy/fleet/."""
