"""Serving the API with uvicorn inside the daemon's task group."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Iterator
from typing import TYPE_CHECKING

import structlog
import uvicorn
from fastapi import FastAPI

from triggerer.service import tls
from triggerer.service.api.app import create_app
from triggerer.service.api.context import ApiContext
from triggerer.service.config import ApiSettings, ConfigError

if TYPE_CHECKING:
    from triggerer.service.daemon.service import Service

log = structlog.get_logger(__name__)

GRACEFUL_SHUTDOWN_S = 5.0
"""How long requests in progress may finish once the daemon stops."""
TICK_S = 1.0
"""How often the server looks at its state while nothing stops it."""


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.stopped = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # SIGTERM and SIGINT are the daemon's: it stops the API with the rest.
        yield

    async def main_loop(self) -> None:
        # uvicorn wakes ten times a second to see whether it should stop; an idle daemon
        # should not. Once a second (the Date header's resolution; a tick numbered 0 renews
        # it) and at once when stopped.
        while not await self.on_tick(0):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopped.wait(), TICK_S)


class ApiServer:
    """Listens on ``[api] host`` and ``port`` (0: a free port) from :meth:`listen` until
    :meth:`stop`."""

    def __init__(self, settings: ApiSettings, app: FastAPI) -> None:
        self._settings = settings
        self._listener: socket.socket | None = None
        context = _tls_context(settings)
        self._scheme = "http" if context is None else "https"
        self._server = _Server(
            uvicorn.Config(
                app,
                lifespan="off",
                log_config=None,  # uvicorn logs through the daemon's logging
                access_log=False,
                timeout_graceful_shutdown=int(GRACEFUL_SHUTDOWN_S),
                ssl_context_factory=None if context is None else lambda *_: context,
            )
        )

    def listen(self) -> None:
        """Bind (a ConfigError naming the address when that fails) and log ``api_listening``
        with the address; requests wait until :meth:`run`."""
        self._listener = _bind(self._settings.host, self._settings.port)
        host, port = self._listener.getsockname()[:2]
        log.info(
            "api_listening",
            host=host,
            port=port,
            url=f"{self._scheme}://{_netloc(host, port)}/api/v1",
            mutual_tls=self._settings.tls_client_ca is not None,
        )
        if self._settings.is_open:
            log.warning(
                "api_open",
                detail="no [api] tokens or principals: anyone on this host may use the API, so "
                "it listens on loopback only",
            )

    async def run(self) -> None:
        """Serve until stopped."""
        if self._listener is None:
            raise RuntimeError("ApiServer.run() before listen()")
        with self._listener:
            await self._server.serve(sockets=[self._listener])

    def stop(self) -> None:
        """Stop accepting requests; those in progress get a few seconds to finish."""
        self._server.should_exit = True
        self._server.stopped.set()


def _tls_context(settings: ApiSettings) -> ssl.SSLContext | None:
    """The HTTPS of ``[api] tls_*``, None without; the settings checked the files already, so a
    ConfigError here means they changed since."""
    if settings.tls_certfile is None or settings.tls_keyfile is None:
        return None
    try:
        return tls.server_context(
            settings.tls_certfile, settings.tls_keyfile, settings.tls_client_ca
        )
    except (OSError, ValueError) as error:  # ssl.SSLError is an OSError
        raise ConfigError(
            f"[api] tls_certfile {settings.tls_certfile}, tls_keyfile {settings.tls_keyfile}, "
            f"tls_client_ca {settings.tls_client_ca}: {error}"
        ) from None


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host``:``port``; a ConfigError naming both when that fails."""
    try:
        family, kind, protocol, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM
        )[0]
        listener = socket.socket(family, kind, protocol)
    except OSError as error:
        raise ConfigError(f"[api] cannot listen on {host}:{port}: {error}") from None
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(2048)
    except OSError as error:
        listener.close()
        raise ConfigError(f"[api] cannot listen on {host}:{port}: {error}") from None
    return listener


def _netloc(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def api_server(service: Service) -> ApiServer:
    """The API server of ``service``'s daemon, listening (see :meth:`ApiServer.listen`)."""
    context = ApiContext(
        settings=service.settings,
        sessions=service.sessions,
        instance_id=service.instance_id,
        registry=lambda: service.registry,
        events_recorded=service.events_recorded,
        wake_scheduler=service.scheduler.wake,
        wake_launcher=service.launcher.wake,
        run_cancelled=service.launcher.cancel_requested,
    )
    server = ApiServer(service.settings.api, create_app(context))
    server.listen()
    return server
