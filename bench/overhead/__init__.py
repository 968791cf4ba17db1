"""The gateway's own cost: what kvroute adds to a request next to a direct call and to sglang-router, in
whole alternating runs (``cases``: issue 40's cases and targets; ``requests``: one run; ``cpu``: a process
tree's CPU time; ``figures``: per-run figures and medians; ``report``, ``plot``: the table, JSON and PNG),
and what a /metrics scrape costs (``scrape``); ``kvroute bench overhead`` (``python -m bench.overhead``)
runs both.

May import: ``systems``.
"""
