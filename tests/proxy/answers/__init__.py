"""Tests of proxy/answers/."""
