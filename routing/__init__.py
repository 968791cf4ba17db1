"""Routing domain: hashing, the per-replica cache model, cost model and policies. Pure and synchronous."""
