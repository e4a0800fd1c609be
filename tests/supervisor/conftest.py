from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.supervisor.fleet import ChildSpec, Fleet


@pytest.fixture
def make_fleet(tmp_path: Path) -> Iterator:
    """``make_fleet(specs, **settings)`` -> an unlaunched :class:`Fleet`; everything it started is killed after
    the test."""
    fleets: list[Fleet] = []

    def make(specs: list[ChildSpec], certs: tuple[str, str] | None = None, **settings: object) -> Fleet:
        d = tmp_path / f"fleet{len(fleets)}"
        d.mkdir()
        fleet = Fleet(dir=d, specs=specs, settings=dict(settings),
                      certfile=certs[0] if certs else None, keyfile=certs[1] if certs else None)
        fleets.append(fleet)
        return fleet

    yield make
    for fleet in fleets:
        fleet.kill_everything()


def _self_signed(directory: Path) -> tuple[str, str]:
    """(certfile, keyfile) for CN=127.0.0.1: with the ``cryptography`` package if installed, else ``openssl``."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    try:
        import cryptography  # noqa: F401
    except ImportError:
        if shutil.which("openssl") is None:
            pytest.skip("needs the cryptography package or the openssl command to make a self-signed certificate")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                        str(cert), "-days", "1", "-subj", "/CN=127.0.0.1"], check=True, capture_output=True,
                       timeout=60)
        return str(cert), str(key)
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(private.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now)
                   .not_valid_after(now + datetime.timedelta(days=1)).sign(private, hashes.SHA256()))
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                          serialization.NoEncryption()))
    return str(cert), str(key)


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    return _self_signed(tmp_path_factory.mktemp("tls"))
