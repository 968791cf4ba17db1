"""Tests of proxy/config/."""
