"""Where a RabbitMQ queue is, and the places in it: ``amqp://HOST[:5672]/VHOST/QUEUE`` URIs,
the dedup keys of its messages, and where a stream queue is read from again."""

from __future__ import annotations

import dataclasses
import hashlib
import urllib.parse
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING

from watchers.uris import split_uri

if TYPE_CHECKING:
    from aio_pika.abc import AbstractIncomingMessage

DEFAULT_PORTS = {"amqp": 5672, "amqps": 5671}
URI_FORM = "amqp://HOST[:5672]/VHOST/QUEUE (%2F for the default vhost '/'; amqps:// for TLS)"


@dataclasses.dataclass(frozen=True)
class RabbitQueue:
    """Where a queue is: the broker, the vhost and the queue's name."""

    host: str
    port: int
    vhost: str
    name: str
    tls: bool = False

    def __str__(self) -> str:
        return f"RabbitMQ queue {self.name!r} in vhost {self.vhost!r} at {self.host}:{self.port}"


def parse_rabbitmq_uri(uri: str) -> RabbitQueue:
    """The queue of ``amqp://HOST[:PORT]/VHOST/QUEUE``; a ``ValueError`` naming ``uri`` and the
    expected form when it is not one. Credentials belong in a named connection, not here."""
    parts, _ = split_uri(uri, kind="RabbitMQ", form=URI_FORM, schemes=DEFAULT_PORTS)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"RabbitMQ URI {uri!r} has a bad port; form: {URI_FORM}") from None
    segments = parts.path.split("/")
    if not parts.hostname or len(segments) != 3 or not segments[1] or not segments[2]:
        raise ValueError(
            f"RabbitMQ URI {uri!r} must have the form {URI_FORM} (a '/' in the vhost or the "
            "queue's name is written %2F)"
        )
    name = urllib.parse.unquote(segments[2])
    if len(name.encode()) > 255:
        raise ValueError(f"RabbitMQ URI {uri!r}: a queue name has at most 255 bytes")
    return RabbitQueue(
        host=parts.hostname,
        port=port or DEFAULT_PORTS[scheme],
        vhost=urllib.parse.unquote(segments[1]),
        name=name,
        tls=scheme == "amqps",
    )


def dedup_key(queue: RabbitQueue, message: AbstractIncomingMessage) -> str | None:
    """``<vhost>/<queue>/<message_id>`` (a ``/`` in the names written ``%2F``, so the default
    vhost is ``%2F``) when the publisher set a message id; else, for a stream queue's message,
    ``<vhost>/<queue>@<offset>@<timestamp>`` (the AMQP timestamp in epoch seconds), or
    ``<vhost>/<queue>@<offset>@sha256:<digest of the body>`` without one; ``None`` otherwise (at
    least once: the delivery tag changes with each delivery).

    A stream recreated under its name numbers its messages from 0 again: the timestamp (or the
    body) tells a new message at a known offset from the old one, as a Kafka key's timestamp
    does, and is the same each time the same message is read."""
    where = f"{slashless(queue.vhost)}/{slashless(queue.name)}"
    if message.message_id:
        return f"{where}/{message.message_id}"
    offset = stream_offset_of(message)
    if offset is None:
        return None
    if message.timestamp is not None:
        return f"{where}@{offset}@{int(message.timestamp.timestamp())}"
    return f"{where}@{offset}@sha256:{hashlib.sha256(message.body).hexdigest()[:16]}"


def stream_offset_of(message: AbstractIncomingMessage) -> int | None:
    """The offset of a stream queue's message (the broker's ``x-stream-offset`` header); ``None``
    for a message of another queue."""
    offset = (message.headers or {}).get("x-stream-offset")
    return offset if isinstance(offset, int) and not isinstance(offset, bool) else None


def checkpoint_prefix(queue: RabbitQueue) -> str:
    """What the stored positions of a stream queue's readers start with (then the reader)."""
    return f"rabbitmq/{slashless(queue.vhost)}/{slashless(queue.name)}/"


def checkpoint_key(queue: RabbitQueue, reader_name: str) -> str:
    """``rabbitmq/<vhost>/<queue>/<reader name>``: where a reader's place in a stream queue is
    stored (the last offset of its events committed)."""
    return checkpoint_prefix(queue) + slashless(reader_name)


@dataclasses.dataclass(frozen=True)
class StreamStart:
    """Where a stream queue's consumer starts, and what each reader skips there."""

    #: The ``x-stream-offset`` to consume from (``None``: the broker's default, ``next``; a
    #: time: the first messages published from then on).
    offset: str | int | datetime | None
    #: By reader: the last offset it has stored already (it skips up to it, included).
    floors: Mapping[str, int]
    #: Whether ``offset`` is a stored position: the message there is expected at once.
    resumed: bool
    #: Whether ``offset`` is the time its readers first started, which only a stream queue
    #: takes (see :mod:`watchers.first_start`): another queue is consumed without it.
    since_first_start: bool = False


def stream_start(configured: str | int | None, stored: Mapping[str, int | None]) -> StreamStart:
    """Where a consumer of readers ``stored`` (each its last stored offset, ``None`` when it has
    none) starts: at the earliest stored offset when any reader has one (the message there is
    read again, and skipped, to show the stream is still the one the offset was stored from),
    else at ``configured``. ``first`` or an offset before that still wins; a reader without a
    stored offset reads from where the consumer starts (past ``configured`` when others have
    stored more), and skips what lies before an offset it was configured with."""
    floors = {key: offset for key, offset in stored.items() if offset is not None}
    if not floors:
        return StreamStart(configured, {}, resumed=False)
    earliest = min(floors.values())
    if configured == "first" or (isinstance(configured, int) and configured <= earliest):
        offset: str | int | None = configured
    else:
        offset = earliest
    if isinstance(configured, int):
        for key, position in stored.items():
            if position is None and configured > 0:
                floors[key] = configured - 1
    return StreamStart(offset, floors, resumed=offset == earliest)


def slashless(name: str) -> str:
    """``name`` with ``/`` written ``%2F`` (as in the URI): the default vhost ``/`` is ``%2F``."""
    return name.replace("/", "%2F")
