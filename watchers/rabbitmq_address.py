"""Where a RabbitMQ queue is: ``amqp://HOST[:5672]/VHOST/QUEUE`` URIs."""

from __future__ import annotations

import dataclasses
import urllib.parse

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
    parts = urllib.parse.urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise ValueError(f"RabbitMQ URI {uri!r} must have the form {URI_FORM}")
    if "@" in parts.netloc:
        raise ValueError(
            f"RabbitMQ URI {uri!r} must not hold credentials: put login and password in a "
            "[connections.NAME] section of the config and pass connection='NAME'"
        )
    if parts.query or parts.fragment:
        raise ValueError(
            f"RabbitMQ URI {uri!r} must not have a query or fragment; pass options as keyword "
            f"arguments. Form: {URI_FORM}"
        )
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
