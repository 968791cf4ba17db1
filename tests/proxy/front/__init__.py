"""Tests of proxy/front/."""
