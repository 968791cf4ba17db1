"""One routed request sent upstream: attempts across replicas, retries, the relay, the client gone.

Here: ``forward`` (the attempt loop), ``attempt`` (one try: lease, deadline, outcome, report),
``stream_relay`` (a streamed answer relayed; failures after the first byte; stalled or departed
clients).

May import: ``context``, ``fleet``, ``observe``, ``upstream``, ``errors``, ``types``.
"""
