"""The host-pool gauge from a replica's Prometheus ``/metrics`` (SGLang serves it with --enable-metrics).

``sglang:hicache_host_used_tokens`` (contract §5.1) is the host pool's ``size - available_size()``. Only
attention-TP rank 0 reports unless --enable-metrics-for-all-schedulers is set, in which case every rank
reports its own (equal-sized) pool, so the value read is the largest sample, not the sum. Through a
kvroute gateway the gauge is read from the replica's own URL (the gateway's /metrics is its own).
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from diag.client import SGLangClient

HOST_USED = "sglang:hicache_host_used_tokens"


def host_used(text: str) -> int | None:
    """The gauge's value in a Prometheus text exposition, or None when absent or unparsable."""
    try:
        for family in text_string_to_metric_families(text):
            if family.name == HOST_USED and family.samples:
                return int(max(s.value for s in family.samples))
    except ValueError:
        return None
    return None


async def read_host_used(client: SGLangClient, replica: str) -> int | None:
    """The replica's host-pool use now; None when /metrics is not exposed or has no such gauge."""
    text = await client.get_text("/metrics", base=replica)
    return host_used(text) if text is not None else None
