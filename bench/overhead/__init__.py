"""The gateway's own cost: what kvroute adds to a request next to a direct call and to sglang-router
(``requests``), and what a /metrics scrape costs (``scrape``); ``python -m bench.overhead`` runs both.

May import: ``systems``.
"""
