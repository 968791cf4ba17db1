"""The command line of ``kvroute serve``: every flag, its help and its default (``proxy/config/settings.py``
converts and validates the values; a flag left out keeps the TOML, environment or default value)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version

from routing.config import POLICY_NAMES

FLAGS: tuple[tuple[str, str, str], ...] = (  # flag, metavar, help
    ("--host", "ADDR", "address to listen on; 0.0.0.0 to accept clients from other hosts"),
    ("--port", "PORT", "port to listen on"),
    (
        "--backend",
        "URL",
        "replica base URL(s): several after one flag (as sglang-router's --worker-urls), comma- or "
        "space-separated, or the flag repeated",
    ),
    (
        "--prefill",
        "URL",
        "prefill server URL(s) of a prefill/decode fleet (SGLang --disaggregation-mode prefill); repeatable",
    ),
    (
        "--prefill-bootstrap-port",
        "PORT",
        "the prefill servers' --disaggregation-bootstrap-port: one for all, or one per --prefill in order "
        "(default: the port each reports in /server_info); repeatable",
    ),
    ("--decode", "URL", "decode server URL(s) of a prefill/decode fleet (docs/pd.md); repeatable"),
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
    (
        "--admin-key",
        "KEY",
        "Bearer key for the admin API, replica control and /flush_cache (all disabled when unset); it "
        "also opens /status and /metrics, which it closes to others (see --public-status)",
    ),
    ("--status-key", "KEY", "a read-only Bearer key for /status and /metrics (e.g. Prometheus' scrape)"),
    (
        "--public-status",
        "BOOL",
        "true: /status and /metrics stay open to anyone even with --admin-key or --status-key",
    ),
    (
        "--replica-api-key",
        "KEY",
        "sent to every replica as Authorization: Bearer KEY (SGLang's --api-key); a client's own "
        "Authorization is never forwarded",
    ),
    ("--max-body-bytes", "BYTES", "largest request body accepted (413 beyond)"),
    ("--body-timeout", "S", "seconds for a request body to arrive once its headers did (408 beyond)"),
    (
        "--client-idle-timeout",
        "S",
        "seconds before an idle client connection, or one whose headers never end, is closed",
    ),
    ("--health-interval", "S", "seconds between active health checks of every replica"),
    ("--request-timeout", "S", "the cap of every deadline: no request waits longer for a replica (504)"),
    ("--connect-timeout", "S", "seconds to connect to a replica before trying the next one"),
    ("--retries", "N", "attempts on other replicas when a request failed before its first byte"),
    (
        "--first-byte-timeout",
        "S",
        "floor of the first-byte deadline, max(this, factor x predicted TTFT + margin); then retried",
    ),
    ("--first-byte-timeout-factor", "X", "the first-byte deadline's multiple of the predicted TTFT"),
    ("--first-byte-timeout-margin", "S", "seconds added to the first-byte deadline"),
    ("--idle-timeout", "S", "seconds a stream may stay silent after its first byte (then an SSE error)"),
    (
        "--decode-timeout-per-token",
        "S",
        "non-streamed answers: seconds per max_tokens added to the first-byte deadline",
    ),
    ("--breaker-failures", "N", "consecutive failed requests that open a replica's circuit breaker"),
    ("--breaker-cooldown", "S", "seconds an open breaker waits before one trial; doubles per trip in a row"),
    ("--breaker-cooldown-max", "S", "the longest open period of a breaker"),
    ("--retry-backoff", "S", "full-jitter backoff before retry k: random in [0, min(max, this x 2^k)]"),
    ("--retry-backoff-max", "S", "the cap of the retry backoff"),
    ("--retry-budget", "RATIO", "retries over 10 s stay under this fraction of the requests (+ the floor)"),
    ("--retry-budget-floor", "N", "retries per second always allowed, however quiet the gateway"),
    (
        "--tokenizer-path",
        "DIR",
        "the model's tokenizer directory (tokenizer.json, tokenizer_config.json): keys from token ids",
    ),
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
        "--workers",
        "N",
        "gateway processes serving the one port (SO_REUSEPORT), under a supervisor; they share routing "
        "state, rate limits and a memory response cache through --state, or without it through the "
        "supervisor's local channel",
    ),
    (
        "--limits-when-store-down",
        "open|closed",
        "while the store of shared rate limits (--state, or the local channel of --workers) does not "
        "answer: open admits on each process's own limits, closed refuses limited keys with 503",
    ),
    (
        "--response-cache",
        "off|memory|URL",
        "exact-response cache of deterministic requests: off, memory, or redis://HOST:PORT/DB",
    ),
    ("--response-cache-ttl", "S", "seconds a cached answer is kept"),
    (
        "--warmup-quiet",
        "S",
        "a warm-up step starts only after this long without a live request on its replica",
    ),
    ("--warmup-step", "S", "seconds of predicted prefill per warm-up step while live requests arrive"),
    ("--warmup-idle-step", "S", "seconds of predicted prefill per warm-up step while none do"),
    ("--response-cache-max-bytes", "BYTES", "memory: bytes of all cached answers; the largest one stored"),
    ("--response-cache-max-entries", "N", "memory: answers kept (least recently used evicted)"),
    (
        "--responses-ttl",
        "S",
        "seconds a stored Responses-API response or conversation is kept since it was last written or "
        "chained on (kept in Redis with --state redis://..., else in this gateway)",
    ),
    (
        "--responses-max-bytes",
        "BYTES",
        "in memory: bytes of all stored responses and conversations; both: the largest one stored",
    ),
    (
        "--responses-max-entries",
        "N",
        "in memory: responses and conversations kept (least recently used evicted)",
    ),
    ("--drain-timeout", "S", "on SIGTERM: seconds in-flight requests get to finish before the exit"),
    (
        "--max-waiting-per-replica",
        "N",
        "requests sent to one replica and waiting for their first byte; with --max-queue-s reached too "
        "on every replica, 429 (0: twice the replica's max_running_requests)",
    ),
    (
        "--max-queue-s",
        "S",
        "predicted prefill seconds waiting on one replica; with --max-waiting-per-replica reached too "
        "on every replica, 429",
    ),
    ("--max-inflight", "N", "requests in progress in this gateway; past it, 429"),
    (
        "--api-keys",
        "FILE",
        "client API keys with tenants and rate limits: a JSON-lines, JSON or TOML file (or inline JSON); "
        "when set, /v1/* and /generate need Authorization: Bearer KEY",
    ),
    ("--max-messages", "N", "chat messages per request (400 beyond)"),
    ("--max-field-bytes", "BYTES", "bytes of any one string in a request body (413 beyond)"),
    ("--max-json-depth", "N", "nesting depth of objects and arrays in a request body (400 beyond)"),
    ("--max-header-bytes", "BYTES", "bytes of a request's header names and values together (431 beyond)"),
    (
        "--client-write-timeout",
        "S",
        "seconds a streamed answer may wait for a client that stopped reading; then it is cut and the "
        "request aborted on its replica",
    ),
    (
        "--warmup-max-tokens-per-tenant",
        "N",
        "tokens of live warmed documents one tenant (or one tenant-less key) may hold (0: no bound)",
    ),
    ("--tls-cert", "FILE", "PEM certificate (chain): serve HTTPS; needs --tls-key"),
    ("--tls-key", "FILE", "PEM private key of --tls-cert"),
    (
        "--kv-events",
        "MODE",
        "subscribe to the KV events of replicas that report a kv_events_config (exact mode): auto (when"
        " --tokenizer-path is given), on (also without: for token-id prompts only), off",
    ),
)
SWITCHES: tuple[tuple[str, str], ...] = (
    ("--no-request-id-headers", "do not forward x-request-id or add x-kvroute-replica"),
    ("--access-log", "log one line per request: method, path, status, replica, reason, TTFT, tokens, id"),
)
_REPEATABLE = {"--discover", "--model-alias", "--prefill", "--prefill-bootstrap-port", "--decode"}
_MANY = {"--backend"}  # takes several values after one flag, and is repeatable too


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
        if flag in _MANY:
            p.add_argument(flag, action="extend", nargs="+", metavar=metavar, help=text + shown)
        else:
            action = "append" if flag in _REPEATABLE else "store"
            p.add_argument(flag, action=action, metavar=metavar, help=text + shown)
    for flag, text in SWITCHES:
        p.add_argument(flag, action="store_const", const=True, help=text)
    return p


def _shown(value: object) -> str:
    return "true" if value is True else "false" if value is False else str(value)
