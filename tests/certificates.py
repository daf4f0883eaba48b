"""A private CA and certificates for the TLS tests, made with the openssl CLI.

``ensure_certificates(folder)`` leaves in ``folder``:

- ``ca.pem`` / ``ca.key``: the test CA
- ``server.pem`` / ``server.key``: the broker's certificate, signed by the CA,
  valid for the name ``localhost`` only (so dialling 127.0.0.1 must fail the
  host-name check)
- ``client.pem`` / ``client.key``: a client certificate with CN
  ``CLIENT_CN``, signed by the CA (SASL EXTERNAL logs in as that CN)
- ``wrong-ca.pem``: an unrelated CA, to verify the broker against and fail

Existing files are kept unless one is missing or expires within
``RENEW_BEFORE_DAYS``; then all are made anew, so they always match.
"""

from __future__ import annotations

import os
import pathlib
import secrets
import subprocess
import tempfile

CLIENT_CN = "pystream-tls-client"
SERVER_NAME = "localhost"
VALID_DAYS = 3650
RENEW_BEFORE_DAYS = 30
CERTIFICATES = ("ca.pem", "server.pem", "client.pem", "wrong-ca.pem")
KEYS = ("ca.key", "server.key", "client.key")

# Extensions that strict verifiers (Python 3.13's default context, Erlang's
# ssl) insist on: a CA with key usage, leaves with CA:FALSE and their usage.
OPENSSL_CONFIG = f"""\
[req]
distinguished_name = dn
[dn]
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = DNS:{SERVER_NAME}
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
[client]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
"""

# P-256 keys: instant to make, and every TLS stack involved speaks them.
NEW_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-noenc"]


def ensure_certificates(folder: pathlib.Path) -> pathlib.Path:
    """Make the certificates in ``folder`` unless valid ones are there."""
    folder.mkdir(parents=True, exist_ok=True)
    if not _all_fresh(folder):
        _generate(folder)
    return folder


def _all_fresh(folder: pathlib.Path) -> bool:
    if not all((folder / name).is_file() for name in CERTIFICATES + KEYS):
        return False
    seconds = str(RENEW_BEFORE_DAYS * 86400)
    return all(subprocess.run(
        ["openssl", "x509", "-noout", "-checkend", seconds,
         "-in", str(folder / name)], capture_output=True).returncode == 0
        for name in CERTIFICATES)


def _generate(folder: pathlib.Path) -> None:
    # Made in a scratch folder and moved in file by file: a reader never sees
    # a half-written file.
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        work = pathlib.Path(scratch)
        config = work / "openssl.cnf"
        config.write_text(OPENSSL_CONFIG)
        _self_signed(work, config, "ca", "pystream test CA")
        _self_signed(work, config, "wrong-ca", "pystream wrong CA")
        _signed(work, config, "server", SERVER_NAME)
        _signed(work, config, "client", CLIENT_CN)
        for name in CERTIFICATES + KEYS:
            os.replace(work / name, folder / name)


def _self_signed(work: pathlib.Path, config: pathlib.Path, name: str,
                 common_name: str) -> None:
    _openssl(work, "req", "-x509", "-new", "-config", str(config),
             "-extensions", "ca", *NEW_KEY, "-keyout", f"{name}.key",
             "-out", f"{name}.pem", "-days", str(VALID_DAYS),
             "-subj", f"/CN={common_name}")


def _signed(work: pathlib.Path, config: pathlib.Path, name: str,
            common_name: str) -> None:
    _openssl(work, "req", "-new", "-config", str(config), *NEW_KEY,
             "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", f"/CN={common_name}")
    _openssl(work, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem",
             "-CAkey", "ca.key", "-set_serial", f"0x{secrets.token_hex(16)}",
             "-days", str(VALID_DAYS), "-extfile", str(config),
             "-extensions", name, "-out", f"{name}.pem")


def _openssl(work: pathlib.Path, *args: str) -> None:
    result = subprocess.run(["openssl", *args], cwd=work, capture_output=True,
                            text=True)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {result.stderr.strip()}")
