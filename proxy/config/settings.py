"""Gateway settings: one frozen value read once at start-up.

Sources, highest precedence first: command-line flags, the TOML file named by ``--config`` (or
``KVROUTE_CONFIG``), ``KVROUTE_<NAME>`` environment variables, then defaults. Every key has the same
name everywhere: flag ``--max-body-bytes`` = TOML ``max_body_bytes`` = env ``KVROUTE_MAX_BODY_BYTES``.
Each key's value formats and checks live in ``proxy/config/converters.py``. An optional TOML table
``[routing]`` sets fields of ``routing.config.RoutingConfig``. The flags and their help live in
``proxy/config/flags.py``.

Values are validated with messages that name the key and where it came from; ``redacted()`` gives the
summary that is logged once (the admin key and inline API keys are never printed).
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.config.converters import CONVERTERS
from proxy.config.flags import parser
from proxy.config.urls import redacted_url
from routing.config import PolicyName, RoutingConfig

MiB = 1024 * 1024


class SettingsError(ValueError):
    """A setting is missing or invalid; the message names the key and its source."""


@dataclass(frozen=True, slots=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8080
    backends: tuple[str, ...] = ()
    prefill: tuple[str, ...] = ()  # prefill servers of a prefill/decode fleet (docs/pd.md)
    prefill_bootstrap_port: tuple[int, ...] = ()  # their bootstrap ports: one for all, or one each
    decode: tuple[str, ...] = ()  # decode servers of a prefill/decode fleet
    config: str | None = None
    policy: PolicyName = "cost"
    admin_key: str | None = None
    status_key: str | None = None  # a read-only key for /status and /metrics (beside the admin key)
    public_status: bool = False  # /status and /metrics open to anyone even when a key is set
    replica_api_key: str | None = None  # sent to every replica as Authorization: Bearer (SGLang --api-key)
    max_body_bytes: int = 32 * MiB
    body_timeout: float = 60.0  # seconds for a request body to arrive once its headers did (408 beyond)
    client_idle_timeout: float = 75.0  # seconds an idle client connection (or unfinished headers) stays open
    health_interval: float = 5.0
    request_timeout: float = 600.0
    connect_timeout: float = 3.0
    retries: int = 2
    first_byte_timeout: float = 5.0  # the floor of the first-byte deadline (proxy/upstream/deadlines.py)
    first_byte_timeout_factor: float = 4.0  # x the predicted TTFT
    first_byte_timeout_margin: float = 2.0  # + this many seconds
    idle_timeout: float = 60.0  # seconds between two chunks of a stream
    decode_timeout_per_token: float = 0.2  # non-streamed answers: + max_tokens x this
    breaker_failures: int = 5  # consecutive failed attempts that open a replica's breaker
    breaker_cooldown: float = 5.0  # its first open period; doubles on each trip in a row
    breaker_cooldown_max: float = 60.0  # the longest open period
    retry_backoff: float = 0.025  # full-jitter backoff before retry k: up to this x 2^k
    retry_backoff_max: float = 0.25  # the cap of that backoff
    retry_budget: float = 0.2  # retries over 10 s stay under this fraction of the requests
    retry_budget_floor: float = 3.0  # plus this many retries per second
    no_request_id_headers: bool = False
    log_level: str = "info"
    seed: int = 0
    session_header: str = "x-session-id"  # the conversation key that makes a session sticky
    session_field: str | None = None  # or a body field holding it (a dotted path: metadata.session_id)
    model_aliases: tuple[tuple[str, str], ...] = ()  # (name clients send, served model)
    single_model_fallback: bool = True  # any unknown name goes to the fleet's only model, as SGLang does
    access_log: bool = False  # one line per request (never prompt text)
    state: str | None = None  # shared state store: a redis:// URL (or memory); None = this gateway alone
    state_namespace: str = "kvroute"  # key namespace in the store: gateways of one fleet share it
    workers: int = 1  # gateway processes on the one port (proxy/runtime/supervisor.py)
    limits_when_store_down: str = "open"  # open | closed: shared rate limits while their store is down
    discover: tuple[str, ...] = ()  # DNS targets whose records are replicas (proxy/fleet/discovery.py)
    discover_interval: float = 5.0  # seconds between resolutions
    discover_drain_timeout: float = 300.0  # a replica gone from DNS is removed when idle, or after this
    dns_server: str | None = None  # HOST[:PORT] that discovery asks instead of the system's resolvers
    response_cache: str = "off"  # off | memory | a redis:// URL (proxy/answers/cache.py)
    response_cache_ttl: float = 600.0  # seconds an answer is kept from its write
    response_cache_max_bytes: int = 256 * MiB  # memory: all answers; both: the largest one stored
    response_cache_max_entries: int = 50_000  # memory: answers kept
    responses_ttl: float = 86400.0  # seconds a stored response or conversation lives unused (proxy/responses)
    responses_max_bytes: int = 256 * MiB  # in memory: all stored responses; both: the largest one stored
    responses_max_entries: int = 100_000  # in memory: responses and conversations kept
    warmup_quiet: float = 1.0  # a warm-up step waits for this long without a live request on its replica
    warmup_step: float = 0.15  # seconds of predicted prefill per warm-up step while live traffic flows
    warmup_idle_step: float = 0.5  # and while none does
    drain_timeout: float = 30.0  # SIGTERM: seconds in-flight requests get to finish (proxy/runtime/drain.py)
    max_waiting_per_replica: int = 0  # sent, no first byte yet; 0 = twice the replica's max_running_requests
    max_queue_s: float = 60.0  # ... and a replica is full only once that much predicted prefill waits
    max_inflight: int = 4096  # requests in progress in this gateway (proxy/fleet/admission.py)
    api_keys: str | None = None  # client keys: a file, or inline JSON (proxy/tenancy/keys.py)
    max_messages: int = 4096  # chat messages per request (proxy/front/input_limits.py)
    max_field_bytes: int = 8 * MiB  # any one string in a request body
    max_json_depth: int = 64  # nesting of objects and arrays in a request body
    max_header_bytes: int = 64 * 1024  # a request's header names and values together (431 beyond)
    client_write_timeout: float = 30.0  # seconds a stream may wait on a client that stopped reading
    warmup_max_tokens_per_tenant: int = 4_000_000  # live warmed tokens one tenant may hold (proxy/warm_api)
    tls_cert: str | None = None  # PEM certificate (chain): serve HTTPS (with tls_key)
    tls_key: str | None = None  # its PEM private key
    tokenizer_path: str | None = (
        None  # the model's tokenizer directory: token-id keys (proxy/exact/tokenizer.py)
    )
    kv_events: str = "auto"  # where replicas report them: auto (with tokenizer_path), on, off (kv_subscriber)
    routing: RoutingConfig = field(default_factory=RoutingConfig)  # its policy and seed follow ours

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise SettingsError("settings 'tls_cert' and 'tls_key' go together: give both or neither")
        _check_pd(self)
        if (self.routing.policy, self.routing.seed) != (self.policy, self.seed):
            object.__setattr__(
                self, "routing", dataclasses.replace(self.routing, policy=self.policy, seed=self.seed)
            )

    def bootstrap_port_of(self, i: int) -> int | None:
        """The configured bootstrap port of the i-th prefill server (None: the one it reports)."""
        ports = self.prefill_bootstrap_port
        return None if not ports else ports[0] if len(ports) == 1 else ports[i]

    @property
    def status_protected(self) -> bool:
        """Do /status and /metrics need a key (the admin key or the status key)?"""
        return (self.admin_key is not None or self.status_key is not None) and not self.public_status

    @property
    def request_id_headers(self) -> bool:
        return not self.no_request_id_headers

    def redacted(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "routing"}
        for secret in ("admin_key", "status_key", "replica_api_key"):
            out[secret] = "***" if getattr(self, secret) else None
        out["backends"] = [redacted_url(b) for b in self.backends]
        out["prefill"] = [redacted_url(b) for b in self.prefill]
        out["decode"] = [redacted_url(b) for b in self.decode]
        inline = self.api_keys is not None and self.api_keys.lstrip()[:1] in ("[", "{")
        out["api_keys"] = "***" if inline else self.api_keys
        out["state"] = redacted_url(self.state) if self.state else None
        out["response_cache"] = redacted_url(self.response_cache)
        out["routing"] = dataclasses.asdict(self.routing)
        return out


def _check_pd(st: Settings) -> None:
    """A prefill/decode fleet: prefill and decode servers together, no unified ``backend`` beside them
    (mixed fleets are refused: docs/pd.md), and one bootstrap port for all prefills or one each."""
    if bool(st.prefill) != bool(st.decode):
        given, missing = ("prefill", "decode") if st.prefill else ("decode", "prefill")
        raise SettingsError(
            f"setting {given!r} needs {missing!r}: a prefill/decode fleet has both kinds of server"
        )
    if st.prefill and st.backends:
        raise SettingsError(
            "settings 'backend' and 'prefill'/'decode' cannot be mixed: a request is served either by one "
            "unified replica or by a prefill/decode pair, and kvroute refuses fleets of both (docs/pd.md)"
        )
    ports = st.prefill_bootstrap_port
    if ports and len(ports) not in (1, len(st.prefill)):
        raise SettingsError(
            f"setting 'prefill_bootstrap_port': {len(ports)} ports for {len(st.prefill)} prefill servers; "
            "give one for all of them or one each, in the order of 'prefill'"
        )


def _convert(key: str, value: object, source: str) -> Any:
    try:
        return CONVERTERS[key](value)
    except ValueError as e:
        raise SettingsError(f"setting {key!r} (from {source}): {e}") from None


def _routing_config(table: object, source: str, base: RoutingConfig) -> RoutingConfig:
    if not isinstance(table, Mapping):
        raise SettingsError(f"setting 'routing' (from {source}): expected a table")
    known = {f.name: f for f in dataclasses.fields(RoutingConfig)}
    changes: dict[str, Any] = {}
    for k, v in table.items():
        if k not in known:
            raise SettingsError(f"setting 'routing.{k}' (from {source}): unknown key")
        want = type(getattr(base, k))
        if want is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if not isinstance(v, want) or (want is int and isinstance(v, bool)):
            raise SettingsError(f"setting 'routing.{k}' (from {source}): expected {want.__name__}")
        changes[k] = v
    return dataclasses.replace(base, **changes)


def _from_env(env: Mapping[str, str]) -> dict[str, tuple[object, str]]:
    return {
        k: (env[f"KVROUTE_{k.upper()}"], f"KVROUTE_{k.upper()}")
        for k in CONVERTERS
        if f"KVROUTE_{k.upper()}" in env
    }


def _from_toml(path: str) -> tuple[dict[str, tuple[object, str]], object]:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise SettingsError(f"setting 'config': cannot read {path}: {e}") from None
    routing = data.pop("routing", None)
    if isinstance(data.get("model_alias"), dict):
        data["model_alias"] = dict(data["model_alias"])
    for k in data:
        if k.replace("-", "_") not in CONVERTERS or k == "config":
            raise SettingsError(f"setting {k!r} (from {path}): unknown key")
    return {k.replace("-", "_"): (v, path) for k, v in data.items()}, routing


def load_settings(argv: Sequence[str], env: Mapping[str, str] | None = None) -> Settings:
    """Flags > TOML > env > defaults; raises SettingsError (argparse exits on unknown flags)."""
    env = os.environ if env is None else env
    defaults = {f.name: getattr(Settings(), f.name) for f in dataclasses.fields(Settings)}
    cli = {k: (v, "command line") for k, v in vars(parser(defaults).parse_args(list(argv))).items()}
    raw: dict[str, tuple[object, str]] = _from_env(env)
    cfg_path = cli.get("config", raw.get("config", (None, "")))[0]
    routing_table: object = None
    if cfg_path is not None:
        toml_values, routing_table = _from_toml(_convert("config", cfg_path, "command line"))
        raw.update(toml_values)
    raw.update(cli)
    values = {k: _convert(k, v, src) for k, (v, src) in raw.items()}
    backends = values.pop("backend", ())
    aliases = values.pop("model_alias", ())
    routing = RoutingConfig()
    if routing_table is not None:
        routing = _routing_config(routing_table, str(cfg_path), routing)
    return Settings(backends=backends, model_aliases=aliases, routing=routing, **values)
