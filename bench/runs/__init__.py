"""Running a workload: the plan's points, a workload prepared at a point, the replay, and what runs beside it.

Here: ``plan`` (points: profile, offered load, seeds), ``prepare`` (settings of a run; a seed's workload at a
point with its floor and deadline), ``replay`` (a workload through one endpoint, every request's
record), ``outages`` (timed faults during a replay), ``cpu`` (other processes' CPU during a run),
``chains`` (conversations turn by turn over chat or the Responses API, a replica killed midway),
``progress``.

May import: ``systems``, ``workloads``.
"""
