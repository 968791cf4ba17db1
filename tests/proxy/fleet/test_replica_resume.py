"""Resume points of hybrid replicas, read from /get_server_info (contract §3.2) into the fleet's snapshots."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.fleet.replica import Replica
from proxy.fleet.replica_info import UNCHUNKED_INTERVAL, parse_replica_info

HYBRID = {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next"}
DENSE = {"architectures": ["LlamaForCausalLM"]}
BASE = {"served_model_name": "m", "page_size": 16, "max_total_num_tokens": 100_000}


@pytest.mark.parametrize(
    ("fields", "model_info", "interval", "at_end"),
    [
        ({"chunked_prefill_size": 2048, "mamba_scheduler_strategy": "auto"}, HYBRID, 2048, True),
        ({"chunked_prefill_size": 8192, "mamba_scheduler_strategy": "no_buffer"}, HYBRID, 8192, True),
        # extra_buffer: tracked states only, every mamba_track_interval tokens rounded down to pages
        (
            {
                "chunked_prefill_size": 2048,
                "mamba_scheduler_strategy": "extra_buffer",
                "mamba_track_interval": 200,
            },
            HYBRID,
            192,
            False,
        ),
        ({"chunked_prefill_size": 2048, "mamba_scheduler_strategy": "extra_buffer"}, HYBRID, 256, False),
        ({"chunked_prefill_size": -1}, HYBRID, UNCHUNKED_INTERVAL, True),  # no chunking: prompt ends only
        ({}, HYBRID, 0, True),  # chunk size not reported: no cut
        ({"chunked_prefill_size": 2048, "mamba_scheduler_strategy": "extra_buffer"}, DENSE, 0, True),
    ],
)
def test_resume_interval_follows_the_scheduler_strategy(
    fields: dict[str, Any], model_info: dict[str, Any], interval: int, at_end: bool
) -> None:
    info = parse_replica_info({**BASE, **fields}, model_info)
    assert (info.resume_interval, info.resume_at_end) == (interval, at_end)
    replica = Replica("http://127.0.0.1:1/")
    assert replica.state().resume_interval == 0  # no info yet: any point resumes
    replica.info = info
    state = replica.state()
    assert (state.resume_interval, state.resume_at_end, state.hybrid) == (interval, at_end, info.hybrid)
