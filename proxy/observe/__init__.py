"""What the gateway observes of itself: metrics, their exposition, recent history, the access log.

Here: ``metrics`` (``GatewayMetrics``, a per-app registry), ``exposition`` (the Prometheus text, written
fast), ``collectors`` (gauges read at scrape time from the fleet and the cache model), ``history``
(bounded ring buffers of decisions and outcomes), ``access_log``, ``said`` (warnings said once, then
at a bounded rate).

May import: ``fleet``, ``upstream``.
"""
