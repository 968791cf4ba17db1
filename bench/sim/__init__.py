"""The fleet simulator: kvroute's real routing against the emulator's real engines, in virtual time.

``kvroute bench sim`` (``bench.sim.cli``); how to run it and read it: docs/simulator.md.

May import: ``workloads`` (and routing, the pure parts of proxy it mirrors, the emulator).
"""
