"""The files ``asyncdp serve`` flags name, checked before anything starts: the TLS pair and the deployment secret.

Each check raises :class:`~asyncdp.errors.ConfigError` naming the flag and what to change (exit 2); neither the
secret nor a key is ever echoed.
"""

from __future__ import annotations

import os
import ssl
import stat

from asyncdp.errors import ConfigError


def read_secret_file(path: str) -> bytes:
    """The deployment secret in ``--data-parallel-secret-file`` (its bytes, surrounding whitespace stripped), or a
    ConfigError naming the flag: a file that is not a readable regular file, is empty, or that its group or others
    may access (as ssh refuses such a private key: ``chmod 600`` it)."""
    flag = f"--data-parallel-secret-file {path!r}"
    try:
        with open(path, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            if not stat.S_ISREG(mode):
                raise ConfigError(f"{flag} is not a regular file.")
            if mode & 0o077:
                raise ConfigError(f"{flag} is accessible by its group or others (mode {stat.S_IMODE(mode):o}); "
                                  f"a secret must be readable by its owner only: chmod 600 it.")
            secret = f.read().strip()
    except OSError as exc:
        raise ConfigError(f"{flag} cannot be read ({exc.strerror or exc}).") from None
    if not secret:
        raise ConfigError(f"{flag} is empty; write a random secret into it, e.g. openssl rand -hex 32 > FILE.")
    return secret


def check_tls_files(certfile: str, keyfile: str) -> None:
    """``--ssl-certfile`` and ``--ssl-keyfile`` are readable and load as one certificate and its key, or a
    ConfigError naming the flag (checked by ``asyncdp serve`` before anything starts; not in ``validate``, which
    also checks configurations derived for other processes and machines)."""
    for flag, path in (("--ssl-certfile", certfile), ("--ssl-keyfile", keyfile)):
        if not os.access(path, os.R_OK) or not os.path.isfile(path):
            raise ConfigError(f"{flag} {path!r} is not a readable file.")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(certfile, keyfile)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"--ssl-certfile {certfile!r} and --ssl-keyfile {keyfile!r} do not load as a certificate "
                          f"and its private key ({exc}).") from None
