"""The fleet: which replicas exist, which are healthy, what they serve and how loaded each is.

Here: ``fleet`` (``Fleet``: membership, health checks, snapshots, load leases, breaker outcomes), ``replica``
and ``replica_info`` (one replica's record and what it says of itself), ``load`` (load in work, not
counts), ``health_log``, ``replica_metrics`` (the replicas' own /metrics, scraped), ``discovery``
(replicas from DNS), ``model_names`` (which served model a name means), ``restarts`` (the one owner
of "this replica restarted"), ``balance`` (seconds each replica sat idle while another had a queue),
``admission`` (whether the gateway takes a request at all: in-flight bound, drain, full replicas).

May import: ``config``, ``upstream``, ``errors``, ``types``.
"""
