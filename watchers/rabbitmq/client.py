"""Connections to RabbitMQ and the passive declare of a queue, for its consumer and for ``send``.

A connection takes the credentials and TLS files of a named connection (else guest/guest) and
names the process to the broker. What the broker refuses becomes an error naming the broker and
the vhost: credentials or a vhost it refuses are a ``PermissionError``, a broker that cannot be
reached a ``ConnectionError``, a queue that does not exist :class:`QueueMissing` (triggerer
declares no queue). aio-pika (the ``rabbitmq`` extra) is imported when a connection is made.
"""

from __future__ import annotations

import os
import socket
import ssl
from typing import TYPE_CHECKING

from triggerer.connections import get_connection
from triggerer.triggers import SourceMissing
from watchers.clients import check_settings, require

if TYPE_CHECKING:
    from aio_pika.abc import AbstractChannel, AbstractConnection

    from watchers.rabbitmq.address import RabbitQueue

#: Settings a named connection may hold.
CONNECTION_KEYS = frozenset(
    {"login", "password", "ssl", "ssl_cafile", "ssl_certfile", "ssl_keyfile"}
)
CONNECT_TIMEOUT_S = 10.0


class QueueMissing(SourceMissing):
    """The queue does not exist (the watcher does not create it)."""


async def connect(queue: RabbitQueue, connection: str | None) -> AbstractConnection:
    """A connection to the vhost of ``queue``, with the credentials of the named ``connection``
    (else guest/guest). Credentials or a vhost the broker refuses are a ``PermissionError``;
    a broker that cannot be reached a ``ConnectionError``."""
    aio_pika = require("aio_pika", "rabbitmq")
    aiormq = require("aiormq", "rabbitmq")
    settings = get_connection(connection) if connection is not None else {}
    check_settings(connection, settings, CONNECTION_KEYS, "RabbitMqTrigger")
    tls = queue.tls or bool(settings.get("ssl"))
    context = None
    if tls:
        context = ssl.create_default_context(cafile=settings.get("ssl_cafile"))
        if settings.get("ssl_certfile"):
            context.load_cert_chain(settings["ssl_certfile"], settings.get("ssl_keyfile"))
    where = f"RabbitMQ at {queue.host}:{queue.port} (vhost {queue.vhost!r})"
    try:
        opened: AbstractConnection = await aio_pika.connect(
            host=queue.host,
            port=queue.port,
            login=str(settings.get("login", "guest")),
            password=str(settings.get("password", "guest")),
            virtualhost=queue.vhost,
            ssl=tls,
            ssl_context=context,
            timeout=CONNECT_TIMEOUT_S,
            client_properties={
                "connection_name": f"triggerer {socket.gethostname()}:{os.getpid()}"
            },
        )
    except (
        aiormq.exceptions.ProbableAuthenticationError,
        aiormq.exceptions.ConnectionNotAllowed,
    ) as error:
        raise PermissionError(f"{where} refuses the connection: {error}") from None
    except aiormq.exceptions.InvalidFrameError:  # the broker closed the handshake at Open
        raise PermissionError(
            f"{where} refuses the connection: does vhost {queue.vhost!r} exist, and may the "
            "login use it?"
        ) from None
    except (OSError, TimeoutError, aiormq.exceptions.AMQPConnectionError) as error:
        raise ConnectionError(f"cannot connect to {where}: {error!r}") from error
    return opened


async def declared(channel: AbstractChannel, queue: RabbitQueue) -> int:
    """The number of ready messages of ``queue`` (a passive declare); :class:`QueueMissing`
    naming it when it does not exist."""
    aiormq = require("aiormq", "rabbitmq")
    try:
        found = await channel.get_queue(queue.name, ensure=True)
    except aiormq.exceptions.ChannelNotFoundEntity:
        raise QueueMissing(
            f"RabbitMQ queue {queue.name!r} does not exist in vhost {queue.vhost!r} at "
            f"{queue.host}:{queue.port}: declare it first (triggerer does not create queues)"
        ) from None
    count = found.declaration_result.message_count
    return int(count or 0)
