"""The converters of setting values: each key's parser and validator, from any source.

Every key's value, whether it comes from a flag, the TOML file or the environment, goes through its
converter in ``CONVERTERS``, which raises ``ValueError`` for an invalid one (``proxy/config/settings.py``
names the key and the source in the message). ``backend`` takes one or several URLs separated by commas or
whitespace, or a list of such strings: the command line gives one string per URL after the flag (as
sglang-router's ``--worker-urls``, ``proxy/config/flags.py``) and the flag may be repeated; TOML may give a
list. ``model_alias`` maps model names clients send to served models (``NAME=MODEL``, repeatable,
comma-separated in the environment, a table ``[model_alias]`` in TOML). ``discover`` takes DNS targets
separated the same way, the flag repeated for several (``dns://NAME:PORT``, ``dns+srv://_PORT._PROTO.NAME``;
``proxy/fleet/discovery.py``). ``prefill`` and ``decode`` take the servers of a prefill/decode fleet as
``backend`` takes replicas, ``prefill_bootstrap_port`` their ports the same way (docs/pd.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from proxy.config.targets import parse_dns_server, parse_target
from proxy.config.urls import parse_url, redacted_url
from routing.config import POLICY_NAMES

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def _response_cache(v: object) -> str:
    """off, memory, or a Redis URL (redis://, rediss:// with a host; unix:// with a path)."""
    if v in ("off", "memory"):
        return str(v)
    parts = urlsplit(v.strip()) if isinstance(v, str) else None
    if parts is None or parts.scheme not in {"redis", "rediss", "unix"}:
        raise ValueError(f"expected off, memory or a redis:// URL, got {v!r}")
    if not (parts.path if parts.scheme == "unix" else parts.hostname):
        raise ValueError(
            f"expected a Redis URL with a host (or a unix socket path), got {redacted_url(str(v))!r}"
        )
    parts.port  # noqa: B018 (raises ValueError for a port that is not a number in range)
    return str(v).strip()


def _words(v: object, what: str) -> list[str]:
    """Items separated by commas or whitespace, from a string or a list of strings."""
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
        raise ValueError(f"expected {what} or a list of them")
    return [w for i in items for w in re.split(r"[,\s]+", i) if w]


def _backends(v: object) -> tuple[str, ...]:
    return tuple(dict.fromkeys(parse_url(u) for u in _words(v, "a URL")))


def _ports(v: object) -> tuple[int, ...]:
    """Ports, separated by commas or whitespace (a list in TOML, or one integer)."""
    items = [str(v)] if isinstance(v, int) and not isinstance(v, bool) else v
    if isinstance(items, list | tuple):
        items = [str(i) if isinstance(i, int) and not isinstance(i, bool) else i for i in items]
    return tuple(_int(1, 65535)(w) for w in _words(items, "a port"))


def _targets(v: object) -> tuple[str, ...]:
    return tuple(dict.fromkeys(str(parse_target(u)) for u in _words(v, "a dns:// or dns+srv:// URI")))


def _dns_server(v: object) -> str:
    host, port = parse_dns_server(_str(v))
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _aliases(v: object) -> tuple[tuple[str, str], ...]:
    pairs: list[tuple[str, object]]
    if isinstance(v, Mapping):
        pairs = [(str(k), val) for k, val in v.items()]
    else:
        pairs = [(w.partition("=")[0], w.partition("=")[2]) for w in _words(v, "NAME=MODEL")]
    for name, model in pairs:
        if not name or not isinstance(model, str) or not model:
            raise ValueError(f"expected NAME=MODEL, got {name}={model!r}")
    return tuple((str(n), str(m)) for n, m in pairs)


def _int(lo: int, hi: int) -> Callable[[object], int]:
    def conv(v: object) -> int:
        if isinstance(v, bool) or not isinstance(v, int | str):
            raise ValueError(f"expected an integer, got {v!r}")
        n = int(v)
        if not lo <= n <= hi:
            raise ValueError(f"expected an integer in [{lo}, {hi}], got {n}")
        return n

    return conv


def _float(lo: float, inclusive: bool = False) -> Callable[[object], float]:
    def conv(v: object) -> float:
        if isinstance(v, bool) or not isinstance(v, int | float | str):
            raise ValueError(f"expected a number, got {v!r}")
        x = float(v)
        if not (x >= lo if inclusive else x > lo):
            raise ValueError(f"expected a number {'>=' if inclusive else '>'} {lo}, got {x}")
        return x

    return conv


def _bool(v: object) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in {"1", "true", "yes", "on", "0", "false", "no", "off"}:
        return v.strip().lower() in {"1", "true", "yes", "on"}
    raise ValueError(f"expected a boolean, got {v!r}")


def _choice(options: Sequence[str]) -> Callable[[object], str]:
    def conv(v: object) -> str:
        if v not in options:
            raise ValueError(f"expected one of {', '.join(options)}, got {v!r}")
        return str(v)

    return conv


def _str(v: object) -> str:
    if not isinstance(v, str) or not v:
        raise ValueError(f"expected a non-empty string, got {v!r}")
    return v


KV_EVENTS_MODES = ("auto", "on", "off")


CONVERTERS: dict[str, Callable[[object], Any]] = {
    "host": _str,
    "port": _int(0, 65535),
    "backend": _backends,
    "prefill": _backends,
    "prefill_bootstrap_port": _ports,
    "decode": _backends,
    "config": _str,
    "policy": _choice(POLICY_NAMES),
    "admin_key": _str,
    "status_key": _str,
    "public_status": _bool,
    "replica_api_key": _str,
    "max_body_bytes": _int(1, 1 << 40),
    "body_timeout": _float(0.0),
    "client_idle_timeout": _float(0.0),
    "health_interval": _float(0.0),
    "request_timeout": _float(0.0),
    "connect_timeout": _float(0.0),
    "retries": _int(0, 10),
    "first_byte_timeout": _float(0.0),
    "first_byte_timeout_factor": _float(0.0, inclusive=True),
    "first_byte_timeout_margin": _float(0.0, inclusive=True),
    "idle_timeout": _float(0.0),
    "decode_timeout_per_token": _float(0.0, inclusive=True),
    "breaker_failures": _int(1, 1000),
    "breaker_cooldown": _float(0.0),
    "breaker_cooldown_max": _float(0.0),
    "retry_backoff": _float(0.0, inclusive=True),
    "retry_backoff_max": _float(0.0, inclusive=True),
    "retry_budget": _float(0.0, inclusive=True),
    "retry_budget_floor": _float(0.0, inclusive=True),
    "no_request_id_headers": _bool,
    "log_level": _choice(LOG_LEVELS),
    "seed": _int(0, (1 << 63) - 1),
    "session_header": _str,
    "session_field": _str,
    "model_alias": _aliases,
    "single_model_fallback": _bool,
    "access_log": _bool,
    "state": _str,
    "state_namespace": _str,
    "workers": _int(1, 256),
    "limits_when_store_down": _choice(("open", "closed")),
    "discover": _targets,
    "discover_interval": _float(0.0),
    "discover_drain_timeout": _float(0.0),
    "dns_server": _dns_server,
    "response_cache": _response_cache,
    "response_cache_ttl": _float(0.0),
    "response_cache_max_bytes": _int(1, 1 << 40),
    "response_cache_max_entries": _int(1, 1 << 31),
    "responses_ttl": _float(0.0),
    "responses_max_bytes": _int(1, 1 << 40),
    "responses_max_entries": _int(1, 1 << 31),
    "warmup_quiet": _float(0.0),
    "warmup_step": _float(0.0),
    "warmup_idle_step": _float(0.0),
    "drain_timeout": _float(0.0),
    "max_waiting_per_replica": _int(0, 1 << 31),
    "max_queue_s": _float(0.0),
    "max_inflight": _int(1, 1 << 31),
    "api_keys": _str,
    "max_messages": _int(1, 1 << 31),
    "max_field_bytes": _int(1, 1 << 40),
    "max_json_depth": _int(2, 1000),
    "max_header_bytes": _int(1024, 1 << 24),
    "client_write_timeout": _float(0.0),
    "warmup_max_tokens_per_tenant": _int(0, 1 << 40),
    "tls_cert": _str,
    "tls_key": _str,
    "tokenizer_path": _str,
    "kv_events": _choice(KV_EVENTS_MODES),
}
