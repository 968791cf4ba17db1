"""What the gateway learns from outside its own requests: other gateways' state and replicas' KV events.

Here: ``state_sync`` (the publisher and reader loops over a state store), ``state_store`` and ``redis_store``
(the store seam: memory, Redis), ``local_hub``, ``local_store`` and ``local_wire`` (the ``--workers``
supervisor's local channel: a store on a Unix socket), ``redis_buckets`` (shared rate-limit buckets),
``shared_docs`` (load, rates and warm-ups other gateways see),
``kv_subscriber``, ``kv_feed``, ``kv_link`` and ``kv_wire`` (SGLang's KV events: subscriptions, one
replica's feed, its connection, the wire format), ``knowledge`` (how far the view of each replica can
be trusted: exact, learned or degraded).

May import: ``context``, ``fleet``, ``observe``, ``upstream``.
"""
