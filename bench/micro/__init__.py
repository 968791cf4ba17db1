"""Micro-benchmarks that print numbers (not tests): routing's hot path and memory, KV-event handling,
the /metrics exposition, tokenizing.

Here: ``routing``, ``kv_events``, ``metrics``, ``tokenizer``.

May import: ``overhead``, ``systems``, ``workloads``.
"""
