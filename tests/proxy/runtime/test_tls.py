"""Optional TLS termination (``--tls-cert/--tls-key``) of a real ``kvroute serve``, with a self-signed
certificate made in the test by ``openssl req``; the flags go together; a bad certificate is one line."""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path

import aiohttp
import pytest

from proxy.server import main as serve_main
from tests.conftest import MODEL, Emulators
from tests.proxy.gateway_proc import gateway_process


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"),
            *("-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return cert, key


async def test_serves_https_with_the_given_certificate(emulator_server: Emulators, tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    emu = await emulator_server("--served-model-name", MODEL, "--emu-time-scale", "0.01")
    flags = ("--backend", emu.url, "--tls-cert", str(cert), "--tls-key", str(key))
    async with gateway_process(tmp_path / "gw.log", *flags) as gw:
        assert gw.url.startswith("https://127.0.0.1:")
        trusted = ssl.create_default_context(cafile=str(cert))
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=trusted)) as s:
            body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
            async with s.post(gw.url + "/v1/completions", json=body) as r:
                assert r.status == 200 and (await r.json())["choices"]
        async with aiohttp.ClientSession() as s:  # the default trust store does not know the cert
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await s.get(gw.url + "/health")
            with pytest.raises(aiohttp.ClientError):  # plain HTTP on the TLS port
                async with s.get(gw.url.replace("https", "http") + "/health") as r:
                    assert r.status != 200


def test_the_flags_go_together_and_a_bad_certificate_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cert, key = _self_signed(tmp_path)
    assert serve_main(["--backend", "http://127.0.0.1:9", "--tls-cert", str(cert)]) == 2
    assert "'tls_cert' and 'tls_key' go together" in capsys.readouterr().err
    assert serve_main(["--backend", "http://127.0.0.1:9", "--tls-cert", str(key), "--tls-key", str(key)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kvroute serve: cannot load the TLS certificate")
