"""``[api] tls_certfile``, ``tls_keyfile`` and ``tls_client_ca``: each file problem is a
configuration error naming the key and the file, before the daemon starts; the CLI's
``--cacert``, ``--cert`` and ``--key`` name the option and the file the same way, and a failed
verification is said in words."""

from __future__ import annotations

import argparse
import json
import os
import ssl
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from tests.fixtures.certificates import Issued, issue, make_ca
from tests.unit.test_config import _clean_environment  # noqa: F401 - autouse: no TRIGGERER_*
from triggerer.service import tls
from triggerer.service.api.server import _tls_context
from triggerer.service.cli import api_client
from triggerer.service.cli.store import CliError
from triggerer.service.config import ApiSettings, ConfigError, load_settings


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Issued]:
    folder = tmp_path_factory.mktemp("pki")
    ca = make_ca(folder)
    return {
        "ca": ca,
        "server": issue(ca, folder, "server"),
        "other": issue(ca, folder, "other"),
        "client": issue(ca, folder, "client", server=False),
    }


def api_config(tmp_path: Path, **keys: object) -> Path:
    path = tmp_path / "triggerer.toml"
    lines = ["[api]", *(f"{key} = {json.dumps(value)}" for key, value in keys.items())]
    path.write_text("\n".join(lines) + "\n")
    return path


def config_error(tmp_path: Path, **keys: object) -> str:
    with pytest.raises(ConfigError) as error:
        load_settings(api_config(tmp_path, **keys))
    return str(error.value)


def test_a_certificate_and_its_key_serve_https(tmp_path: Path, pki: dict[str, Issued]) -> None:
    server = pki["server"]
    settings = load_settings(
        api_config(tmp_path, tls_certfile=str(server.certfile), tls_keyfile=str(server.keyfile))
    )
    assert (settings.api.tls_certfile, settings.api.tls_keyfile) == (
        server.certfile,
        server.keyfile,
    )
    context = _tls_context(settings.api)
    assert context is not None
    assert context.verify_mode == ssl.CERT_NONE
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert _tls_context(ApiSettings()) is None


def test_a_client_ca_asks_for_client_certificates(tmp_path: Path, pki: dict[str, Issued]) -> None:
    server = pki["server"]
    settings = load_settings(
        api_config(
            tmp_path,
            tls_certfile=str(server.certfile),
            tls_keyfile=str(server.keyfile),
            tls_client_ca=str(pki["ca"].certfile),
        )
    )
    context = _tls_context(settings.api)
    assert context is not None
    assert context.verify_mode == ssl.CERT_REQUIRED


def test_a_certificate_needs_its_key_and_a_key_its_certificate(
    tmp_path: Path, pki: dict[str, Issued]
) -> None:
    server = pki["server"]
    error = config_error(tmp_path, tls_certfile=str(server.certfile))
    assert (
        f"  api.tls_keyfile = None: HTTPS with the certificate {server.certfile} needs its "
        "private key: set tls_keyfile too, or neither (or set TRIGGERER_API__TLS_KEYFILE)"
    ) in error
    error = config_error(tmp_path, tls_keyfile=str(server.keyfile))
    assert (
        f"  api.tls_keyfile = '{server.keyfile}': a key without its certificate: set "
        "tls_certfile too, or neither"
    ) in error
    error = config_error(tmp_path, tls_client_ca=str(pki["ca"].certfile))
    assert (
        f"  api.tls_client_ca = '{pki['ca'].certfile}': mutual TLS needs HTTPS: set "
        "tls_certfile and tls_keyfile too, or remove it"
    ) in error


def encrypted_key(tmp_path: Path, issued: Issued) -> Path:
    path = tmp_path / "encrypted.key"
    path.write_bytes(
        issued.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    return path


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        ("tls_certfile", "cannot be read: No such file or directory"),
        ("tls_certfile", "cannot be read: Is a directory"),
        ("tls_certfile", "holds no PEM certificate (-----BEGIN CERTIFICATE-----)"),
        ("tls_keyfile", "cannot be read: No such file or directory"),
        ("tls_keyfile", "holds no PEM private key (-----BEGIN PRIVATE KEY-----)"),
        ("tls_keyfile", "is not the private key of the certificate in {certfile}"),
        ("tls_keyfile", "is an encrypted private key, which would need a password"),
        ("tls_client_ca", "cannot be read: No such file or directory"),
        ("tls_client_ca", "holds no PEM certificate (-----BEGIN CERTIFICATE-----)"),
    ],
    ids=[
        "certfile-missing",
        "certfile-folder",
        "certfile-a-key",
        "keyfile-missing",
        "keyfile-a-certificate",
        "keyfile-another-key",
        "keyfile-encrypted",
        "client_ca-missing",
        "client_ca-a-key",
    ],
)
def test_each_bad_file_is_named_with_its_key(
    tmp_path: Path, pki: dict[str, Issued], key: str, problem: str
) -> None:
    server = pki["server"]
    keys = {
        "tls_certfile": server.certfile,
        "tls_keyfile": server.keyfile,
        "tls_client_ca": pki["ca"].certfile,
    }
    if problem.startswith("cannot be read: No such"):
        keys[key] = tmp_path / "missing.pem"
    elif "directory" in problem:
        keys[key] = tmp_path
    elif "no PEM certificate" in problem:
        keys[key] = server.keyfile
    elif "no PEM private key" in problem:
        keys[key] = server.certfile
    elif "encrypted" in problem:
        keys[key] = encrypted_key(tmp_path, server)
    else:
        keys[key] = pki["other"].keyfile
    error = config_error(tmp_path, **{name: str(path) for name, path in keys.items()})
    assert error.startswith(f"invalid configuration in {tmp_path / 'triggerer.toml'}:\n")
    (line,) = error.splitlines()[1:]
    expected = problem.format(certfile=server.certfile)
    assert line.startswith(f"  api.{key} = '{keys[key]}': {expected}"), line
    assert line.endswith(f"(or set TRIGGERER_API__{key.upper()})")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_key_is_named(tmp_path: Path, pki: dict[str, Issued]) -> None:
    server = pki["server"]
    keyfile = tmp_path / "server.key"
    keyfile.write_bytes(server.keyfile.read_bytes())
    keyfile.chmod(0)
    error = config_error(tmp_path, tls_certfile=str(server.certfile), tls_keyfile=str(keyfile))
    assert f"  api.tls_keyfile = '{keyfile}': cannot be read: Permission denied" in error


def test_with_the_api_off_the_files_are_not_read(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.pem")
    settings = load_settings(
        api_config(tmp_path, enabled=False, tls_certfile=missing, tls_keyfile=missing)
    )
    assert str(settings.api.tls_certfile) == missing
    assert "a key without its certificate" in config_error(
        tmp_path, enabled=False, tls_keyfile=missing
    )


def cli_options(api: str, **files: Path) -> tuple[argparse.Namespace, str]:
    parser = argparse.ArgumentParser()
    api_client.add_tls_options(parser)
    given = [part for name, path in files.items() for part in (f"--{name}", str(path))]
    return parser.parse_args(given), api


def test_the_clis_tls_options_name_the_option_and_the_file(pki: dict[str, Issued]) -> None:
    ca, client, server = pki["ca"], pki["client"], pki["server"]
    https = "https://127.0.0.1:8443"
    context = api_client.verify(*cli_options(https, cacert=ca.certfile))
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname
    with_certificate = cli_options(https, cert=client.certfile, key=client.keyfile)
    assert isinstance(api_client.verify(*with_certificate), ssl.SSLContext)
    assert api_client.verify(*cli_options("http://127.0.0.1:8080")) is True

    refused = {
        (
            "http://127.0.0.1:8080",
            (("cacert", ca.certfile),),
        ): "--cacert applies only with an https:// --api URL, got http://127.0.0.1:8080",
        (https, (("cacert", server.keyfile),)): (
            f"--cacert {server.keyfile} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
        ),
        (https, (("key", client.keyfile),)): (
            "--key is the key of a client certificate: give --cert FILE too"
        ),
        (https, (("cert", client.keyfile), ("key", client.keyfile))): (
            f"--cert {client.keyfile} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
        ),
        (https, (("cert", client.certfile),)): (
            f"--cert {client.certfile} holds no PEM private key (-----BEGIN PRIVATE KEY-----)"
        ),
        (https, (("cert", client.certfile), ("key", server.keyfile))): (
            f"--key {server.keyfile} is not the private key of the certificate in {client.certfile}"
        ),
    }
    for (api, files), message in refused.items():
        with pytest.raises(CliError) as error:
            api_client.verify(*cli_options(api, **dict(files)))
        assert str(error.value) == message


def test_a_certificate_with_its_key_in_one_file_is_a_client_certificate(
    tmp_path: Path, pki: dict[str, Issued]
) -> None:
    client = pki["client"]
    both = tmp_path / "client.pem"
    both.write_bytes(client.certfile.read_bytes() + client.keyfile.read_bytes())
    assert isinstance(api_client.verify(*cli_options("https://h:1", cert=both)), ssl.SSLContext)
    tls.check_key(both, both)


def test_tls_options_without_api_are_refused() -> None:
    options, _ = cli_options("", cacert=Path("ca.crt"), cert=Path("c.crt"))
    with pytest.raises(CliError, match=r"^--cacert, --cert apply only with --api https://\.\.\.$"):
        api_client.refuse_without_api(options)


def test_a_certificate_for_other_names_is_said_so() -> None:
    mismatch = ssl.SSLCertVerificationError(1, "certificate verify failed")
    mismatch.verify_code = api_client.X509_V_ERR_HOSTNAME_MISMATCH
    mismatch.verify_message = "Hostname mismatch, certificate is not valid for 'h'."
    options, _ = cli_options("https://h:1")
    said = api_client.unreachable(_wrapped(mismatch), "https://h:1", options)
    assert str(said) == (
        "the API at https://h:1 has a certificate for other names: Hostname mismatch, "
        "certificate is not valid for 'h'. Reach it by a name (or address) its certificate "
        "names"
    )


def _wrapped(error: Exception) -> Exception:
    """``error`` under httpx's ConnectError, as httpx raises it."""
    import httpx

    try:
        raise httpx.ConnectError(str(error)) from error
    except httpx.ConnectError as wrapped:
        return wrapped
