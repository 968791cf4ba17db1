"""Tests of proxy/tenancy/."""
