"""The replica client: the one place that talks HTTP to replicas, and what a request to one may cost.

Here: ``client`` (``Upstream``: send, read, stream, control calls; aiohttp errors become ``UpstreamError``),
``relay`` (headers kept and dropped, SSE sniffing, usage), ``credentials`` (the gateway's own
authorization per replica), ``deadlines``, ``liveness`` (first-byte waits that last while a replica
works), ``breaker`` (per-replica circuit breakers), ``retry_budget``.

May import: ``config``, ``errors``, ``types``.
"""
