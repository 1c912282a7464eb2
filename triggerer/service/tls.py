"""TLS from PEM files: the checks of the ``[api] tls_*`` settings, the API server's context and
the CLI's client context. Each problem is a :class:`TlsFileError` saying what is wrong with the
file; the caller names the setting or option and the file."""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

PEM_CERTIFICATE = "-----BEGIN CERTIFICATE-----"
PEM_PRIVATE_KEY = "-----BEGIN PRIVATE KEY-----"


class TlsFileError(ValueError):
    """A certificate or key file that cannot serve: missing, unreadable, not PEM, encrypted, or
    a key that is not the certificate's."""


class _Encrypted(TlsFileError):
    """Raised by the password callback: OpenSSL would otherwise ask on the terminal."""


def _no_password() -> bytes:
    raise _Encrypted("is an encrypted private key")


def check_certificates(path: Path) -> None:
    """``path`` holds at least one PEM certificate (a certificate chain, a CA bundle)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_verify_locations(cafile=path)
    except ssl.SSLError:
        raise TlsFileError(f"holds no PEM certificate ({PEM_CERTIFICATE})") from None
    except OSError as error:
        raise TlsFileError(f"cannot be read: {error.strerror or error}") from None


def check_key(keyfile: Path, certfile: Path) -> None:
    """``keyfile`` is an unencrypted PEM private key, the key of the first certificate in
    ``certfile`` (which :func:`check_certificates` has passed)."""
    try:
        keyfile.read_bytes()
    except OSError as error:
        raise TlsFileError(f"cannot be read: {error.strerror or error}") from None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(certfile, keyfile, password=_no_password)
    except _Encrypted:
        raise TlsFileError(
            "is an encrypted private key, which would need a password: give the key "
            "unencrypted (openssl pkey -in KEY -out PLAIN_KEY) in a file only the daemon's user "
            "may read"
        ) from None
    except ssl.SSLError as error:
        if error.reason == "KEY_VALUES_MISMATCH":
            raise TlsFileError(f"is not the private key of the certificate in {certfile}") from None
        raise TlsFileError(f"holds no PEM private key ({PEM_PRIVATE_KEY})") from None
    except OSError as error:  # the certificate file went away meanwhile
        raise TlsFileError(f"cannot be used with {certfile}: {error}") from None


def server_context(certfile: Path, keyfile: Path, client_ca: Path | None) -> ssl.SSLContext:
    """HTTPS with the certificate (chain) in ``certfile`` and its key; with ``client_ca``,
    mutual TLS: a client must present a certificate that CA signed. TLS 1.2 at least."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certfile, keyfile, password=_no_password)
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cafile=client_ca)
    context.set_alpn_protocols(["http/1.1"])
    return context


def client_context(
    cacert: Path | None, cert: Path | None = None, key: Path | None = None
) -> ssl.SSLContext:
    """What a client verifies a server with, the host name checked: the CA bundle ``cacert``
    (default: the system's trust store, or ``SSL_CERT_FILE``); with ``cert``, the client's own
    certificate and its ``key`` (or a key in ``cert``) for mutual TLS. Check the files first
    (:func:`check_certificates`, :func:`check_key`) for errors that say what is wrong."""
    context = ssl.create_default_context(cafile=cacert)
    if cert is not None:
        context.load_cert_chain(cert, key, password=_no_password)
    return context
