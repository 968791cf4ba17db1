"""Tests of proxy/admin/."""
