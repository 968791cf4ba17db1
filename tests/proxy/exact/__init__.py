"""Tests of proxy/exact/."""
