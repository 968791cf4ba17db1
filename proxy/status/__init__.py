"""``/status`` for programs and people, and the gateway's self-observation started with the app.

Here: ``document`` (the JSON document), ``page`` (the live status page, ``static/status.html``),
``observers`` (the fleet collector and the replica scraper, started with the app).

May import: ``context``, ``exact``, ``fleet``, ``observe``, ``errors``.
"""
