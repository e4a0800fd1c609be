"""TLS on both sides of a real ``asyncdp route``: its own listener with ``--ssl-certfile``/``--ssl-keyfile``, and
``https://`` endpoints verified against ``--upstream-ca-file`` (or the system's CAs, which do not know a
self-signed certificate: such an endpoint is not used, and ``/health`` says why)."""

from __future__ import annotations

import shutil
import ssl
from pathlib import Path

import anyio
import httpx
import pytest

from asyncdp.api.serve import SSLFiles
from tests.router.upstream import echo_upstream, header_values, routed, stop

pytestmark = pytest.mark.anyio


async def cert_for_localhost(directory: Path) -> tuple[Path, Path]:
    """``(keyfile, certfile)``: a self-signed certificate for 127.0.0.1 (as its subjectAltName, which a client
    checks an IP address against), made with the ``openssl`` command; skip without it."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a self-signed certificate")
    key, cert = directory / "key.pem", directory / "cert.pem"
    with anyio.fail_after(30):
        await anyio.run_process(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                                 "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                                 "-addext", "subjectAltName=IP:127.0.0.1"])
    return key, cert


async def test_the_router_serves_https_and_verifies_an_https_endpoint_against_the_ca_file(tmp_path: Path) -> None:
    key, cert = await cert_for_localhost(tmp_path)
    args = ("--ssl-certfile", str(cert), "--ssl-keyfile", str(key), "--upstream-ca-file", str(cert))
    async with (echo_upstream(ssl=SSLFiles(certfile=str(cert), keyfile=str(key))) as upstream,
                routed(tmp_path / "router.log", upstream.url, args=args) as router):
        assert upstream.url.startswith("https://") and router.base_url.startswith("https://127.0.0.1:")
        with anyio.fail_after(20):
            trust = ssl.create_default_context(cafile=str(cert))
            async with httpx.AsyncClient(base_url=router.base_url, verify=trust, timeout=10) as http:
                r = await http.post("/v1/completions", json={"prompt": "hi"})
                health = await http.get("/health")
        assert r.status_code == 200 and r.json()["scheme"] == "https"  # the upstream was reached over TLS
        assert header_values(r.json(), "x-forwarded-proto") == ["https"]  # how the client reached the router
        assert health.status_code == 200 and health.json()["num_usable"] == 1
        assert await stop(router) == 0
        assert "Traceback" not in router.log()


async def test_an_https_endpoint_whose_certificate_does_not_verify_is_not_used(tmp_path: Path) -> None:
    key, cert = await cert_for_localhost(tmp_path)
    async with (echo_upstream(ssl=SSLFiles(certfile=str(cert), keyfile=str(key))) as upstream,
                routed(tmp_path / "router.log", upstream.url) as router):
        with anyio.fail_after(20):
            async with httpx.AsyncClient(base_url=router.base_url, timeout=10) as http:
                r = await http.post("/v1/completions", json={"prompt": "hi"})
                health = await http.get("/health")
        assert r.status_code == 503 and upstream.seen == []
        assert health.status_code == 503 and "CERTIFICATE_VERIFY_FAILED" in health.json()["endpoints"][0]["error"]
        assert await stop(router) == 0
