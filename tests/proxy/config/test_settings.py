"""Settings: precedence flags > TOML > env > defaults, validation messages naming the key, redaction."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.config.settings import MiB, Settings, SettingsError, load_settings
from proxy.server import main as serve_main
from proxy.upstream.breaker import BreakerPolicy
from proxy.upstream.deadlines import Deadlines


def test_defaults() -> None:
    s = load_settings([], env={})
    assert s == Settings()
    assert s.max_body_bytes == 32 * MiB and s.request_id_headers and s.routing.policy == "cost"


def test_precedence_flags_over_toml_over_env(tmp_path: Path) -> None:
    cfg = tmp_path / "kvroute.toml"
    cfg.write_text(
        'port = 9001\nretries = 4\nbackend = ["http://a:1", "http://b:2/"]\npolicy = "round_robin"\n'
    )
    env = {"KVROUTE_PORT": "9000", "KVROUTE_RETRIES": "1", "KVROUTE_SEED": "7", "KVROUTE_CONFIG": str(cfg)}
    s = load_settings(["--port", "9002", "--backend", "http://c:3"], env=env)
    assert s.port == 9002  # flag
    assert s.retries == 4  # TOML over env
    assert s.seed == 7 and s.routing.seed == 7  # env over default
    assert s.backends == ("http://c:3",)  # the flag replaces, it does not merge
    assert s.policy == "round_robin" and s.routing.policy == "round_robin"
    assert load_settings([], env=env).backends == ("http://a:1", "http://b:2")


def test_env_only_and_booleans() -> None:
    env = {
        "KVROUTE_BACKEND": "http://a:1,http://b:2",
        "KVROUTE_NO_REQUEST_ID_HEADERS": "true",
        "KVROUTE_ADMIN_KEY": "s3cret",
    }
    s = load_settings([], env=env)
    assert s.backends == ("http://a:1", "http://b:2") and not s.request_id_headers
    assert s.redacted()["admin_key"] == "***" and "s3cret" not in repr(s.redacted())
    assert load_settings(["--no-request-id-headers"], env={}).no_request_id_headers


def test_routing_table(tmp_path: Path) -> None:
    cfg = tmp_path / "k.toml"
    cfg.write_text('policy = "least_load"\n[routing]\ntokens_per_request = 64\nprefill_tokens_per_s = 9000\n')
    s = load_settings(["--config", str(cfg)], env={})
    assert s.routing.tokens_per_request == 64 and s.routing.prefill_tokens_per_s == 9000.0
    assert s.routing.policy == "least_load"


@pytest.mark.parametrize(
    ("argv", "env", "toml", "needle"),
    [
        (["--port", "70000"], {}, None, "'port' (from command line)"),
        ([], {"KVROUTE_PORT": "abc"}, None, "'port' (from KVROUTE_PORT)"),
        ([], {}, "retries = -1\n", "'retries' (from "),
        ([], {}, 'policy = "fastest"\n', "'policy'"),
        ([], {}, "bogus = 1\n", "'bogus'"),
        ([], {}, "[routing]\nnope = 1\n", "'routing.nope'"),
        ([], {}, '[routing]\nseed = "x"\n', "'routing.seed'"),
        (["--backend", "ftp://x"], {}, None, "'backend'"),
        (["--health-interval", "0"], {}, None, "'health_interval'"),
        ([], {"KVROUTE_NO_REQUEST_ID_HEADERS": "maybe"}, None, "'no_request_id_headers'"),
        ([], {}, "port = [", "'config'"),
    ],
)
def test_validation_names_the_key(
    tmp_path: Path, argv: list[str], env: dict[str, str], toml: str | None, needle: str
) -> None:
    if toml is not None:
        (tmp_path / "c.toml").write_text(toml)
        argv = [*argv, "--config", str(tmp_path / "c.toml")]
    with pytest.raises(SettingsError) as info:
        load_settings(argv, env=env)
    assert needle in str(info.value)


def test_serve_rejects_bad_settings(capsys: pytest.CaptureFixture[str]) -> None:
    assert serve_main(["--port", "-1"]) == 2
    assert "'port'" in capsys.readouterr().err


def test_fault_settings_reach_the_deadlines_breaker_and_budget(tmp_path: Path) -> None:
    cfg = tmp_path / "k.toml"
    cfg.write_text("idle_timeout = 9\nbreaker_cooldown = 2.5\n")
    env = {"KVROUTE_FIRST_BYTE_TIMEOUT": "1.5", "KVROUTE_RETRY_BUDGET": "0"}
    s = load_settings(["--config", str(cfg), "--breaker-failures", "3"], env=env)
    d = Deadlines.of(s)
    assert (d.first_byte_timeout, d.idle_timeout, d.request_timeout) == (1.5, 9.0, 600.0)
    assert (BreakerPolicy.of(s).failures, BreakerPolicy.of(s).cooldown_s) == (3, 2.5)
    assert s.retry_budget == 0.0
    for bad in (["--breaker-failures", "0"], ["--idle-timeout", "0"], ["--retry-budget", "-1"]):
        with pytest.raises(SettingsError, match=bad[0][2:].replace("-", "_")):
            load_settings(bad, env={})
