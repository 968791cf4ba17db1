"""What runs under test: emulated fleets, routers started from command templates, the oracle, Redis.

Here: ``procs`` (processes: free ports, readiness, stop by PID), ``fleet`` (``EmulatorFleet`` and its
counters), ``registry`` (the systems: kvroute's policies, sglang-router, client round robin, the
oracle), ``oracle`` (routes on the emulators' true predicted TTFT), ``gateway_pool`` (several kvroute
gateways behind a client-side round robin), ``redis_proc``.

May import: ``workloads``.
"""
