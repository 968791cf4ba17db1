"""Labs that push a real gateway past the happy path: faults injected per kind, fuzzed bodies, a soak.

Here: ``fault_lab`` and ``faults`` (``python -m bench.labs.faults``), ``fuzz`` and ``fuzz_bodies``
(``python -m bench.labs.fuzz``), ``soak`` (``make soak``), ``proc_stats`` (RSS and file descriptors).

May import: ``reports``, ``runs``, ``systems``.
"""
