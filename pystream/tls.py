"""TLS settings given as file paths (a CA bundle, a client certificate and
its key), for the callers that cannot hand over an ``ssl.SSLContext``: the
Spark data source and ``read_range`` (a context does not pickle, so each
executor builds its own from the same paths) and the command line.
"""

from __future__ import annotations

import re
import ssl
from typing import Any

from .errors import CertificateVerificationError

SASL_MECHANISMS = ("PLAIN", "EXTERNAL")

# OpenSSL's verify codes for a certificate that does not name the host dialled.
X509_V_ERR_HOSTNAME_MISMATCH = 62
X509_V_ERR_IP_ADDRESS_MISMATCH = 64


def tls_context(ca_file: str | None = None, cert_file: str | None = None,
                key_file: str | None = None) -> ssl.SSLContext:
    """A verifying client context: the CAs of ``ca_file`` (a PEM bundle; None:
    the system's), and the client certificate ``cert_file`` with its private
    key ``key_file`` (None: the key is in ``cert_file``). A file that is
    missing or not PEM raises ``ValueError`` naming it."""
    if key_file is not None and cert_file is None:
        raise ValueError("a TLS client key needs its certificate: name the "
                         "certificate file too")
    try:
        context = ssl.create_default_context(cafile=ca_file)
    except OSError as exc:  # ssl.SSLError too; neither names the file
        raise ValueError(f"cannot load the TLS CA file {ca_file}: "
                         f"{_reason(exc)}") from exc
    if cert_file is not None:
        try:
            context.load_cert_chain(cert_file, key_file)
        except OSError as exc:
            files = cert_file if key_file is None else f"{cert_file} and {key_file}"
            raise ValueError(f"cannot load the TLS client certificate "
                             f"{files}: {_reason(exc)}") from exc
    return context


def check_tls_settings(tls: bool, *, ca_file: str | None, cert_file: str | None,
                       key_file: str | None, sasl_mechanism: str) -> None:
    """Refuse settings that would be ignored or could not log in, before
    any connection is tried. TLS is on for ``rabbitmq-stream+tls://`` URIs
    only: switching it on for a plain URI would keep the plain port (5552)."""
    if sasl_mechanism not in SASL_MECHANISMS:
        raise ValueError(f"the SASL mechanism is one of "
                         f"{', '.join(SASL_MECHANISMS)}, not {sasl_mechanism!r}")
    if not tls and (ca_file or cert_file or key_file):
        raise ValueError("a TLS CA file or client certificate needs a "
                         "rabbitmq-stream+tls:// URI (default port 5551)")
    if sasl_mechanism == "EXTERNAL" and not (tls and cert_file):
        raise ValueError("SASL EXTERNAL logs in as the name of the TLS client "
                         "certificate: it needs a rabbitmq-stream+tls:// URI "
                         "and a client certificate file")


def tls_options(tls: bool, *, ca_file: str | None = None,
                cert_file: str | None = None, key_file: str | None = None,
                sasl_mechanism: str = "PLAIN") -> dict[str, Any]:
    """The ``connect`` options for these settings, checked, with the TLS
    context built (its files read) now, in the calling process."""
    check_tls_settings(tls, ca_file=ca_file, cert_file=cert_file,
                       key_file=key_file, sasl_mechanism=sasl_mechanism)
    options: dict[str, Any] = {"sasl_mechanism": sasl_mechanism}
    if tls:
        options["ssl_context"] = tls_context(ca_file, cert_file, key_file)
    return options


def certificate_error(where: str, exc: ssl.SSLCertVerificationError
                      ) -> CertificateVerificationError:
    """OpenSSL's reason, with what to change: a name check or a trust
    failure each have one fix."""
    reason = (exc.verify_message or str(exc)).rstrip(".")
    if exc.verify_code in (X509_V_ERR_HOSTNAME_MISMATCH,
                           X509_V_ERR_IP_ADDRESS_MISMATCH):
        return CertificateVerificationError(
            where, reason, "connect with a host name the certificate lists",
            untrusted=False)
    return CertificateVerificationError(
        where, reason, "pass ssl_context= an ssl.SSLContext that trusts the "
        "CA that signed it, e.g. ssl.create_default_context(cafile=...)")


def _reason(exc: OSError) -> str:
    """``No such file or directory``, or OpenSSL's words without the
    ``(_ssl.c:4154)`` of where CPython raised them."""
    return re.sub(r"\s*\(_ssl\.c:\d+\)$", "", exc.strerror or str(exc))
