"""The command line of ``kvroute serve``: every flag, its help and its default (``proxy/settings.py``
converts and validates the values; a flag left out keeps the TOML, environment or default value)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version

from routing.config import POLICY_NAMES

FLAGS: tuple[tuple[str, str, str], ...] = (  # flag, metavar, help
    ("--host", "ADDR", "address to listen on; 0.0.0.0 to accept clients from other hosts"),
    ("--port", "PORT", "port to listen on"),
    ("--backend", "URL", "replica base URL(s), comma- or space-separated; repeatable"),
    (
        "--discover",
        "URI",
        "replicas from DNS, re-resolved: dns://NAME:PORT (A/AAAA) or dns+srv://_PORT._PROTO.NAME; repeatable",
    ),
    ("--discover-interval", "S", "seconds between DNS resolutions of the --discover targets"),
    (
        "--discover-drain-timeout",
        "S",
        "a replica gone from DNS is drained, then removed when idle or after this many seconds",
    ),
    ("--dns-server", "HOST[:PORT]", "DNS server that --discover asks (default: the system's resolvers)"),
    ("--config", "FILE", "TOML settings file (keys as the flags, with underscores)"),
    ("--policy", "NAME", f"routing policy: {', '.join(POLICY_NAMES)}"),
    ("--admin-key", "KEY", "Bearer key for the admin API and /flush_cache (both disabled when unset)"),
    ("--max-body-bytes", "BYTES", "largest request body accepted (413 beyond)"),
    ("--body-timeout", "S", "seconds for a request body to arrive once its headers did (408 beyond)"),
    ("--idle-timeout", "S", "seconds before an idle connection, or one whose headers never end, is closed"),
    ("--health-interval", "S", "seconds between active health checks of every replica"),
    ("--request-timeout", "S", "seconds without a byte from the replica before the request fails (504)"),
    ("--connect-timeout", "S", "seconds to connect to a replica before trying the next one"),
    ("--retries", "N", "attempts on other replicas when a request failed before its first byte"),
    ("--log-level", "LEVEL", "debug, info, warning, error or critical"),
    ("--seed", "N", "seed of every tie-break (a run is reproducible for a given request order)"),
    (
        "--session-header",
        "HEADER",
        "request header carrying the conversation key that keeps a session sticky",
    ),
    (
        "--session-field",
        "PATH",
        "body field carrying the conversation key instead, a dotted path: metadata.session_id",
    ),
    (
        "--model-alias",
        "NAME=MODEL",
        "NAME=MODEL: requests for NAME go to the replicas serving MODEL; repeatable",
    ),
    (
        "--single-model-fallback",
        "BOOL",
        "true: any unknown model name goes to the fleet's only model, as SGLang",
    ),
    (
        "--state",
        "URL",
        "share routing state with other gateways: redis://HOST:PORT/DB (rediss://, redis+cluster://, "
        "redis+sentinel://HOST:PORT/SERVICE) or memory",
    ),
    ("--state-namespace", "NAME", "key namespace in the state store: the gateways of one fleet share it"),
    (
        "--response-cache",
        "off|memory|URL",
        "exact-response cache of deterministic requests: off, memory, or redis://HOST:PORT/DB",
    ),
    ("--response-cache-ttl", "S", "seconds a cached answer is kept"),
    ("--response-cache-max-bytes", "BYTES", "memory: bytes of all cached answers; the largest one stored"),
    ("--response-cache-max-entries", "N", "memory: answers kept (least recently used evicted)"),
)
SWITCHES: tuple[tuple[str, str], ...] = (
    ("--no-request-id-headers", "do not forward x-request-id or add x-kvroute-replica"),
    ("--access-log", "log one line per request: method, path, status, replica, reason, TTFT, tokens, id"),
)
_REPEATABLE = {"--backend", "--discover", "--model-alias"}


def kvroute_version() -> str:
    try:
        return version("kvroute")
    except PackageNotFoundError:
        return "unknown"


def parser(defaults: Mapping[str, object]) -> argparse.ArgumentParser:
    """The flags with help texts naming each default (``defaults`` by setting name)."""
    p = argparse.ArgumentParser(
        prog="kvroute serve",
        argument_default=argparse.SUPPRESS,
        description="The kvroute gateway: an OpenAI-compatible, prefix- and tier-aware router for SGLang.",
    )
    p.add_argument("--version", action="version", version=f"kvroute {kvroute_version()}")
    for flag, metavar, text in FLAGS:
        name = flag[2:].replace("-", "_")
        default = defaults.get("backends" if name == "backend" else name)
        shown = f" (default: {_shown(default)})" if default not in (None, (), "") else ""
        action = "append" if flag in _REPEATABLE else "store"
        p.add_argument(flag, action=action, metavar=metavar, help=text + shown)
    for flag, text in SWITCHES:
        p.add_argument(flag, action="store_const", const=True, help=text)
    return p


def _shown(value: object) -> str:
    return "true" if value is True else "false" if value is False else str(value)
