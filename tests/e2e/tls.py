"""A self-signed certificate for the TLS end-to-end tests (made with the ``openssl`` command; skip without it)."""

from __future__ import annotations

import shutil
from pathlib import Path

import anyio
import pytest


async def self_signed_cert(directory: Path) -> tuple[Path, Path]:
    """``(keyfile, certfile)`` for CN 127.0.0.1 in ``directory``."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a self-signed certificate")
    key, cert = directory / "key.pem", directory / "cert.pem"
    with anyio.fail_after(30):
        await anyio.run_process(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                                 "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1"])
    return key, cert
