"""Seeded workloads and what they ask of a fleet: generators, their shapes, offered load, the floor.

Here: ``generators`` (the registry of workloads: rag, agent, mixed, hot, ...), ``rag``, ``shapes`` (fleet
shape, requests, outages), ``text`` (seeded synthetic text), ``load`` (rescaling to an offered load),
``floor`` (what no router can beat), ``tokens`` (prompts tokenized as the emulated replicas do).

May import: nothing of ``bench`` (``emulator`` for its tokenizers and timing).
"""
