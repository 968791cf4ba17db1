"""Where each replica of one `kvroute emulate` process listens, and the check that no two ports clash.

With `--replicas N` (or `--ports P0,...`), replica i (0-based, in port order) uses:

- HTTP: `--port` + i (or the i-th of `--ports`);
- the PD bootstrap server (prefill replicas only): `--disaggregation-bootstrap-port` + i (0 stays 0:
  each replica binds a free port);
- KV events (`--kv-events-config`): the publisher endpoint's TCP port + i*S and the replay endpoint's TCP
  port + i*S. S is 1 (SGLang's DP-rank offset) when the N publisher and N replay ports so obtained are
  all distinct; otherwise S = |replay port - publisher port| + 1, so that replica i's pair sits between
  replica i-1's and replica i+1's: with endpoint :5557 and replay :5558, replicas 0, 1, 2 publish on
  5557, 5559, 5561 and replay on 5558, 5560, 5562. `ipc://` / `inproc://` endpoints get the suffix
  `_dp<i>` instead. Without a replay endpoint S is 1.

Every TCP port of that layout (whatever its host: a publisher that connects names the port its subscriber
binds) must differ from every other; `check` refuses the ones that do not (the same port for publisher
and replay, a KV or bootstrap port among the HTTP ports, a port beyond 65535) and names them. HTTP port 0
(any free port) is not checked.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from emulator.kv_events import KvEventsConfig, offset_endpoint

_TCP = re.compile(r"tcp://.*:(\d+)")
MAX_PORT = 65535


def tcp_port(endpoint: str | None) -> int | None:
    """The port of a `tcp://host:port` endpoint, None for any other transport."""
    m = _TCP.fullmatch(endpoint or "")
    return int(m.group(1)) if m else None


def kv_stride(cfg: KvEventsConfig | None, replicas: int) -> int:
    """S of the module docstring: 1 unless the replicas' publisher and replay ports would meet."""
    if cfg is None:
        return 1
    pub, replay = tcp_port(cfg.endpoint), tcp_port(cfg.replay_endpoint)
    if pub is None or replay is None or pub == replay:
        return 1
    pubs = {pub + i for i in range(replicas)}
    if pubs.isdisjoint(replay + i for i in range(replicas)):
        return 1
    return abs(replay - pub) + 1


def _named_ports(
    http: Sequence[int], bootstraps: Sequence[int | None], kv: KvEventsConfig | None, stride: int
) -> list[tuple[int, str]]:
    named: list[tuple[int, str]] = []
    for i, port in enumerate(http):
        if port:
            named.append((port, f"replica {i}'s HTTP port"))
        if i < len(bootstraps) and bootstraps[i]:
            named.append((bootstraps[i] or 0, f"replica {i}'s PD bootstrap port"))
        if kv is None or not kv.enabled:
            continue
        for what, endpoint in (("KV-event publisher", kv.endpoint), ("KV-event replay", kv.replay_endpoint)):
            kv_port = tcp_port(offset_endpoint(endpoint, i, stride) if endpoint else None)
            if kv_port is not None:
                named.append((kv_port, f"replica {i}'s {what} endpoint"))
    return named


def check(
    http: Sequence[int], bootstraps: Sequence[int | None], kv: KvEventsConfig | None, stride: int
) -> None:
    """ValueError naming the first port used twice, or beyond 65535, in the layout of `http` (with each
    replica's bootstrap port, None for a replica without one)."""
    seen: dict[int, str] = {}
    for port, what in _named_ports(http, bootstraps, kv, stride):
        if port > MAX_PORT:
            raise ValueError(f"port {port} ({what}) is beyond {MAX_PORT}: pick lower base ports")
        if port in seen:
            raise ValueError(
                f"port {port} would be both {seen[port]} and {what}; choose ports that do not meet "
                "(the layout of --replicas is in `kvroute emulate --help` and emulator/port_plan.py)"
            )
        seen[port] = what
