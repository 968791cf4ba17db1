"""Confirming the simulator on real runs: ``kvroute bench sim --real``.

The same scenarios ``bench.sim`` draws (fleet shape, requests, session headers, outputs, fleet changes)
run over HTTP through the real kvroute gateway, the real sglang-router and kvroute's round robin, each in
front of a fresh fleet of ``kvroute emulate`` processes, one system after the other; the simulator runs the
same scenarios and systems, and the two are compared scenario by scenario (docs/simulator.md, "Confirming
on real runs").

Here: ``workload`` (a scenario as real requests, on a wall-clock time scale), ``fleet`` (the scenario's
replicas as emulator processes), ``routers`` (the real systems and their fleet changes), ``trial`` (one
system on one scenario over HTTP), ``comparison`` (the real against the simulated figures), ``report``
(comparison.md / .json / .png), ``cli``.

May import: ``sim``, ``systems``, ``runs``, ``workloads``.
"""
