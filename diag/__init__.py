"""HiCache diagnostics against any SGLang server or kvroute gateway, over HTTP only.

    kvroute probe URL   seed 1's eviction-reuse probe (diag/probe.py): R cold, eviction pressure sized
                        from the replica's pools, R again (from host?), R again (from GPU); a verdict
    kvroute ab URL...   seed 2's cold/hot A/B (diag/ab.py): flush, cold, hot; median of 3 runs
    kvroute status --gateway URL   a gateway's /status as text, refreshed in place (diag/status.py)

Modules: client (SGLang HTTP), target (what the URL is, its pools), prompts (unique random prompts),
pressure (sizing), verdict, metrics (the host-pool gauge), progress, report, options, status_view
(the /status document as text).
"""
