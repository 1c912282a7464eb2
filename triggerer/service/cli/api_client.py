"""The CLI as a client of a daemon's REST API (``--api URL``) over HTTPS: the options
``--cacert``, ``--cert`` and ``--key``, what httpx verifies the API with, and one-line errors for
a TLS connection that fails."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from triggerer.service.cli.store import CliError

if TYPE_CHECKING:
    import argparse
    import ssl
    from collections.abc import Callable

    import httpx

# The ssl module and triggerer.service.tls are imported when a verb talks to the API: the
# parser (`triggerer --help`) has no use for them.

X509_V_ERR_HOSTNAME_MISMATCH = 62
"""OpenSSL's verify code for a certificate issued for other names than the URL's host."""
TLS_OPTIONS = ("cacert", "cert", "key")
"""The options :func:`add_tls_options` adds, by their ``argparse`` names."""


def add_tls_options(command: argparse.ArgumentParser) -> None:
    """``--cacert``, ``--cert`` and ``--key`` on a verb that takes ``--api``."""
    group = command.add_argument_group("HTTPS, for an --api https:// URL")
    group.add_argument(
        "--cacert",
        type=Path,
        metavar="FILE",
        help="the CA certificate(s), PEM, to verify the API's certificate with (default: the "
        "system's trust store); e.g. the self-signed CA of a test deployment",
    )
    group.add_argument(
        "--cert",
        type=Path,
        metavar="FILE",
        help="a client certificate, PEM, for an API that asks for one (mutual TLS)",
    )
    group.add_argument(
        "--key", type=Path, metavar="FILE", help="the private key of --cert (default: in --cert)"
    )


def refuse_without_api(arguments: argparse.Namespace) -> None:
    """A CliError when a TLS option is given without ``--api``: it would do nothing."""
    given = _given(arguments)
    if given:
        raise CliError(f"{given} only with --api https://...")


def _given(arguments: argparse.Namespace) -> str:
    """The TLS options given, as a phrase: ``--cacert applies``, ``--cert, --key apply``."""
    given = [f"--{option}" for option in TLS_OPTIONS if getattr(arguments, option) is not None]
    return f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'}" if given else ""


def verify(arguments: argparse.Namespace, base: str) -> ssl.SSLContext | bool:
    """What httpx verifies the API at ``base`` with: for an https:// URL a context trusting
    ``--cacert`` (or the system's trust store), with ``--cert`` and ``--key``; a CliError naming
    the option and the file that is wrong."""
    from triggerer.service import tls

    cacert, cert, key = (getattr(arguments, option) for option in TLS_OPTIONS)
    if not base.lower().startswith("https://"):
        given = _given(arguments)
        if given:
            raise CliError(f"{given} only with an https:// --api URL, got {base}")
        return True
    if key is not None and cert is None:
        raise CliError("--key is the key of a client certificate: give --cert FILE too")
    if cacert is not None:
        _check("--cacert", cacert, lambda: tls.check_certificates(cacert))
    if cert is not None:
        keyfile = key or cert
        _check("--cert", cert, lambda: tls.check_certificates(cert))
        _check("--key" if key else "--cert", keyfile, lambda: tls.check_key(keyfile, cert))
    return tls.client_context(cacert, cert, key)


def _check(option: str, path: Path, check: Callable[[], None]) -> None:
    """``check()``, its error a CliError naming ``option`` and ``path``."""
    from triggerer.service import tls

    try:
        check()
    except tls.TlsFileError as error:
        raise CliError(f"{option} {path} {error}") from None


def unreachable(error: httpx.HTTPError, base: str, arguments: argparse.Namespace) -> CliError:
    """The error of a request to the API at ``base`` that got no answer, in one line."""
    import httpx

    said = _tls_failure(error, base, arguments)
    if said is not None:
        return CliError(said)
    what = str(error) or type(error).__name__
    if not isinstance(error, (httpx.RemoteProtocolError, httpx.ReadError)):
        return CliError(f"cannot reach the API at {base}: {what}")
    # Closed without an answer. A daemon serving HTTPS does that to plain HTTP; with mutual TLS,
    # to a client whose certificate it does not take (TLS 1.3 refuses the certificate after the
    # client has sent its request, and the client sees only the connection close).
    if base.lower().startswith("http://"):
        hint = "an API serving HTTPS does that to plain HTTP: is it https://?"
    elif arguments.cert is None:
        hint = (
            "an API that asks for client certificates (mutual TLS) does that to a client "
            "without one: give --cert FILE and --key FILE"
        )
    else:
        hint = (
            f"an API that asks for client certificates does that to one it does not take: "
            f"is --cert {arguments.cert} signed by the CA it trusts?"
        )
    return CliError(f"the API at {base} closed the connection without an answer ({what}); {hint}")


def _tls_failure(error: BaseException, base: str, arguments: argparse.Namespace) -> str | None:
    """What went wrong, in words, when the TLS of a request to ``base`` failed with ``error``
    (httpx's, raised from the ssl module's); None when it was no TLS failure."""
    import ssl

    cause = _ssl_cause(error)
    if isinstance(cause, ssl.SSLCertVerificationError):
        if cause.verify_code == X509_V_ERR_HOSTNAME_MISMATCH:
            return (
                f"the API at {base} has a certificate for other names: {cause.verify_message} "
                f"Reach it by a name (or address) its certificate names"
            )
        trusted = (
            f"the CA in --cacert {arguments.cacert}"
            if arguments.cacert
            else "the system's trust store"
        )
        return (
            f"the API at {base} has a certificate that does not verify against {trusted}: "
            f"{cause.verify_message}; give the CA that signed it with --cacert FILE"
        )
    if cause is None:
        return None
    reason = cause.reason or str(cause)
    if reason in ("TLSV13_ALERT_CERTIFICATE_REQUIRED", "SSLV3_ALERT_HANDSHAKE_FAILURE") and (
        arguments.cert is None
    ):
        return (
            f"the API at {base} asks for a client certificate (mutual TLS): give --cert FILE "
            f"and --key FILE, signed by the CA it trusts ({reason})"
        )
    if arguments.cert is not None and reason in _REFUSED_CERTIFICATE:
        return f"the API at {base} refused the client certificate {arguments.cert} ({reason})"
    if reason == "WRONG_VERSION_NUMBER":
        return f"the API at {base} does not speak HTTPS ({reason}): try http://"
    return f"TLS with the API at {base} failed: {reason}"


_REFUSED_CERTIFICATE = frozenset(
    {
        "TLSV1_ALERT_UNKNOWN_CA",
        "SSLV3_ALERT_BAD_CERTIFICATE",
        "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
        "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE",
        "SSLV3_ALERT_CERTIFICATE_EXPIRED",
        "TLSV1_ALERT_ACCESS_DENIED",
        "SSLV3_ALERT_HANDSHAKE_FAILURE",
    }
)
"""The alerts a server sends back about a client certificate it does not take."""


def _ssl_cause(error: BaseException) -> ssl.SSLError | None:
    """The ssl module's error under httpx's (and httpcore's) wrappers."""
    import ssl

    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ssl.SSLError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None
