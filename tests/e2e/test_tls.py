"""HTTPS through ``triggerer run --config FILE`` with ``[api] tls_certfile`` and ``tls_keyfile``
of a self-signed CA made in the test: the API answers a client that trusts the CA and fails the
verification of one that does not; ``events emit --api https://... --cacert CA`` posts, and
without ``--cacert`` says in one line why not; the UI loads in Debian's Chromium over HTTPS
with no console errors; plain HTTP to the port is closed unanswered. With ``tls_client_ca``
(mutual TLS) a client without a certificate, or with one another CA signed, is refused, and one
with a certificate that CA signed is served, the CLI's ``--cert``/``--key`` too.

One daemon per configuration; no Spark (no run starts)."""

from __future__ import annotations

import shutil
import socket
import ssl
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import httpx
import pytest
from playwright.async_api import async_playwright

from tests.e2e.daemon import Deployment, sqlite_url, triggerer_cli
from tests.e2e.test_import_errors import without_triggerer_variables
from tests.e2e.test_ui import CHROMIUM, collect_errors, shoot
from tests.fixtures.certificates import Issued, issue, make_ca

if TYPE_CHECKING:
    from pathlib import Path

    from tests.e2e.daemon import DaemonProcess

NO_SPARK = "sc://127.0.0.1:1"  # no run starts: matched waits for customers too
MATCHED = """
    from triggerer import Asset, pipeline

    @pipeline(schedule=Asset("orders") & Asset("customers"))
    def matched(spark, context):
        pass
"""
REFUSED = (httpx.ReadError, httpx.RemoteProtocolError, httpx.ConnectError)
"""How a client's request fails when the server ends the TLS connection: before the handshake
is done (TLS 1.2) or just after it, when the server has read the client's certificate (1.3)."""


async def start(tmp_path: Path, **tls: str) -> tuple[DaemonProcess, str, Path]:
    """The daemon of ``MATCHED`` with the API on a free loopback port and ``[api]`` ``tls``;
    its logged API URL and its config file."""
    deployment = Deployment(tmp_path, sqlite_url(tmp_path), NO_SPARK, bootstrap="", topic="")
    deployment.write_pipelines(MATCHED)
    config = deployment.config_file(api={"enabled": True, "port": 0, **tls})
    daemon = deployment.process_with_config(config)
    daemon.start()
    await daemon.wait_logged("pipelines_loaded")
    (listening,) = await daemon.wait_logged("api_listening")
    url: str = listening["url"]
    assert url.startswith("https://"), listening
    assert listening["mutual_tls"] is ("tls_client_ca" in tls)
    return daemon, url, config


async def emit(config: Path, url: str, *options: str) -> tuple[int, str, str]:
    """``triggerer events emit orders --api URL OPTIONS``: exit code, stdout, stderr."""
    done = await triggerer_cli(
        without_triggerer_variables(),
        "--config",
        str(config),
        "events",
        "emit",
        "orders",
        "--api",
        url,
        *options,
    )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def plain_http_answer(url: str) -> bytes:
    """What the server sends back to a plain HTTP request on the HTTPS port, until it closes."""
    parts = urlsplit(url)
    assert parts.hostname is not None
    assert parts.port is not None
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as connection:
        connection.sendall(b"GET /api/v1/healthz HTTP/1.1\r\nHost: triggerer\r\n\r\n")
        answer = b""
        while chunk := connection.recv(4096):
            answer += chunk
    return answer


def trusting(ca: Issued, client: Issued | None = None) -> ssl.SSLContext:
    """A client context trusting ``ca`` alone, presenting ``client``'s certificate if given."""
    context = ssl.create_default_context(cafile=ca.certfile)
    if client is not None:
        context.load_cert_chain(client.certfile, client.keyfile)
    return context


@pytest.mark.timeout(240)
async def test_https_for_the_api_the_cli_and_the_ui(tmp_path: Path) -> None:
    ca = make_ca(tmp_path / "pki")
    server = issue(ca, tmp_path / "pki", "server")
    tls = {"tls_certfile": str(server.certfile), "tls_keyfile": str(server.keyfile)}
    daemon, url, config = await start(tmp_path, **tls)
    with daemon:
        # A client that trusts the CA is served; one that does not (httpx's certifi bundle)
        # fails the verification.
        async with httpx.AsyncClient(verify=trusting(ca)) as client:
            healthz = await client.get(f"{url}/healthz")
            assert healthz.status_code == 200, healthz.text
            pipelines = (await client.get(f"{url}/pipelines")).json()
            assert [pipeline["pipeline_id"] for pipeline in pipelines] == ["matched"]
        with pytest.raises(httpx.ConnectError) as unverified:
            async with httpx.AsyncClient() as client:
                await client.get(f"{url}/healthz")
        assert "certificate verify failed: unable to get local issuer certificate" in str(
            unverified.value
        )

        # Plain HTTP to the port: the TLS layer closes the connection without a byte back.
        http_url = url.replace("https://", "http://", 1)
        assert plain_http_answer(http_url) == b""
        with pytest.raises(httpx.RemoteProtocolError):
            async with httpx.AsyncClient() as client:
                await client.get(f"{http_url}/healthz")

        # The CLI: --cacert trusts the CA; without it, one line saying why.
        code, out, err = await emit(config, url, "--cacert", str(ca.certfile))
        assert (code, err) == (0, ""), err
        assert out == "event 1 on orders; queued for matched\n"
        code, out, err = await emit(config, url)
        base = url.removesuffix("/api/v1")
        assert code == 1
        assert out == ""
        assert err == (
            f"triggerer: the API at {base} has a certificate that does not verify against the "
            "system's trust store: unable to get local issuer certificate; give the CA that "
            "signed it with --cacert FILE\n"
        )
        code, _, err = await emit(config, http_url)
        assert code == 1
        assert err.startswith(
            f"triggerer: the API at {base.replace('https', 'http', 1)} closed the connection "
            "without an answer ("
        ), err
        assert err.endswith("an API serving HTTPS does that to plain HTTP: is it https://?\n")
        code, _, err = await emit(config, url, "--cacert", str(server.keyfile))
        assert code == 1
        assert err == (
            f"triggerer: --cacert {server.keyfile} holds no PEM certificate "
            "(-----BEGIN CERTIFICATE-----)\n"
        )

        if shutil.which("chromium") is None:
            pytest.skip("the UI's part needs Debian's chromium")
        async with async_playwright() as playwright:
            # Chromium trusts the server's key as it would a certificate of its trust store:
            # every other certificate error still stops the page.
            browser = await playwright.chromium.launch(
                executable_path=CHROMIUM,
                headless=True,
                args=[f"--ignore-certificate-errors-spki-list={server.spki_sha256()}"],
            )
            page = await browser.new_page(viewport={"width": 1400, "height": 800})
            errors = collect_errors(page)
            await page.goto(f"{base}/")
            await page.wait_for_function("window.triggerer.cy?.nodes().length >= 4")
            assert await page.evaluate("location.protocol") == "https:"
            await shoot(page, "https")
            await browser.close()
        assert errors == []


@pytest.mark.timeout(180)
async def test_mutual_tls_serves_only_clients_with_a_certificate_of_the_client_ca(
    tmp_path: Path,
) -> None:
    pki = tmp_path / "pki"
    ca = make_ca(pki)
    server = issue(ca, pki, "server")
    clients_ca = make_ca(pki, "clients-ca")
    client = issue(clients_ca, pki, "client", server=False)
    stranger = issue(ca, pki, "stranger", server=False)  # the server's CA, not the clients'
    tls = {
        "tls_certfile": str(server.certfile),
        "tls_keyfile": str(server.keyfile),
        "tls_client_ca": str(clients_ca.certfile),
    }
    daemon, url, config = await start(tmp_path, **tls)
    with daemon:
        async with httpx.AsyncClient(verify=trusting(ca, client)) as with_certificate:
            healthz = await with_certificate.get(f"{url}/healthz")
            assert healthz.status_code == 200, healthz.text
        for who in (None, stranger):
            with pytest.raises(REFUSED):
                async with httpx.AsyncClient(verify=trusting(ca, who)) as refused:
                    await refused.get(f"{url}/healthz")

        # The CLI: --cert and --key; without, one line naming them.
        cacert = ("--cacert", str(ca.certfile))
        code, out, err = await emit(
            config, url, *cacert, "--cert", str(client.certfile), "--key", str(client.keyfile)
        )
        assert (code, err) == (0, ""), err
        assert out == "event 1 on orders; queued for matched\n"
        code, _, err = await emit(config, url, *cacert)
        assert code == 1
        assert err.endswith(
            "an API that asks for client certificates (mutual TLS) does that to a client "
            "without one: give --cert FILE and --key FILE\n"
        ), err
        code, _, err = await emit(
            config, url, *cacert, "--cert", str(client.certfile), "--key", str(server.keyfile)
        )
        assert code == 1
        assert err == (
            f"triggerer: --key {server.keyfile} is not the private key of the certificate in "
            f"{client.certfile}\n"
        )
