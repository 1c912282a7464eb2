"""The GAPIC asyncio clients of a Pub/Sub puller or sender, and how they are made.

For the emulator (``emulator_host``, else ``$PUBSUB_EMULATOR_HOST``) the clients share an
insecure ``grpc.aio`` channel; for Pub/Sub itself they are given the credentials of the named
connection's ``credentials_file`` (a service account's JSON key), else the application default
credentials.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from triggerer.connections import get_connection
from watchers.clients import check_settings, require

if TYPE_CHECKING:
    from google.pubsub_v1.services.publisher import PublisherAsyncClient
    from google.pubsub_v1.services.subscriber import SubscriberAsyncClient

#: Settings a named connection may hold.
CONNECTION_KEYS = frozenset({"credentials_file"})
SCOPES = ("https://www.googleapis.com/auth/pubsub",)


class Clients:
    """The GAPIC asyncio clients of one puller or sender, and how to close them."""

    def __init__(
        self,
        subscriber: SubscriberAsyncClient,
        publisher: PublisherAsyncClient | None,
        close: Callable[[], Awaitable[None]],
    ) -> None:
        self.subscriber = subscriber
        self.publisher = publisher
        self.aclose = close


async def connect(
    emulator_host: str | None, connection: str | None, *, publisher: bool = False
) -> Clients:
    """The clients for the emulator at ``emulator_host`` (else ``$PUBSUB_EMULATOR_HOST``) on an
    insecure channel, else for Pub/Sub with the connection's ``credentials_file`` (a service
    account's JSON key), else with the application default credentials."""
    subscriber_module = require("google.pubsub_v1.services.subscriber", "pubsub")
    publisher_module = require("google.pubsub_v1.services.publisher", "pubsub")
    settings = get_connection(connection) if connection is not None else {}
    check_settings(connection, settings, CONNECTION_KEYS, "the Pub/Sub watcher")
    host = emulator_host or os.environ.get("PUBSUB_EMULATOR_HOST") or None
    if host is not None:
        # The GAPIC asyncio clients ignore PUBSUB_EMULATOR_HOST: they are handed the channel.
        grpc = require("grpc", "pubsub")
        channel = grpc.aio.insecure_channel(host)
        transports = subscriber_module.transports, publisher_module.transports
        subscriber = subscriber_module.SubscriberAsyncClient(
            transport=transports[0].SubscriberGrpcAsyncIOTransport(channel=channel)
        )
        sender = None
        if publisher:
            sender = publisher_module.PublisherAsyncClient(
                transport=transports[1].PublisherGrpcAsyncIOTransport(channel=channel)
            )
        return Clients(subscriber, sender, channel.close)
    # Reading a key file, or asking a metadata server, blocks: not on the event loop.
    credentials = await asyncio.to_thread(_credentials, settings.get("credentials_file"))
    subscriber = subscriber_module.SubscriberAsyncClient(credentials=credentials)
    sender = publisher_module.PublisherAsyncClient(credentials=credentials) if publisher else None

    async def close() -> None:
        await subscriber.transport.close()
        if sender is not None:
            await sender.transport.close()

    return Clients(subscriber, sender, close)


def _credentials(credentials_file: str | None) -> Any:
    if credentials_file is not None:
        service_account = require("google.oauth2.service_account", "pubsub")
        try:
            return service_account.Credentials.from_service_account_file(
                credentials_file, scopes=SCOPES
            )
        except (OSError, ValueError) as error:
            raise ValueError(
                f"credentials_file {credentials_file!r} is not a service account's JSON key: "
                f"{error}"
            ) from None
    google_auth = require("google.auth", "pubsub")
    exceptions = require("google.auth.exceptions", "pubsub")
    try:
        credentials, _ = google_auth.default(scopes=SCOPES)
    except exceptions.DefaultCredentialsError as error:
        raise ValueError(
            "no Google credentials: name a connection with credentials_file (a service "
            "account's JSON key), set up application default credentials, or give "
            f"emulator_host / PUBSUB_EMULATOR_HOST for the emulator ({error})"
        ) from None
    return credentials
