"""``MessageQueueTrigger``: one entry point that picks the queue trigger from a URI."""

from __future__ import annotations

import importlib.metadata
import urllib.parse
from collections.abc import Callable
from typing import Any

from triggerer.triggers import BaseEventTrigger
from watchers.kafka import KafkaTrigger
from watchers.sqs import SqsTrigger
from watchers.sqs_address import is_sqs_queue_url

PROVIDER_GROUP = "triggerer.queue_providers"
DEFAULT_KAFKA_PORT = 9092
_KAFKA_FORM = "kafka://host:port[,host:port]/topic[,topic]"
_BUILT_IN_SCHEMES = ("kafka", "sqs", "https")

QueueProvider = Callable[..., BaseEventTrigger]


def MessageQueueTrigger(queue: str, **options: Any) -> BaseEventTrigger:
    """The trigger for the queue at ``queue``; ``options`` go to that trigger.

    ``kafka://host:port[,host:port]/topic[,topic]`` gives a ``KafkaTrigger``;
    ``sqs://name?region=..&endpoint_url=..`` or ``https://sqs.<region>.amazonaws.com/<acct>/<name>``
    an ``SqsTrigger``. Other schemes come from the ``triggerer.queue_providers`` entry points
    (name: the scheme; value: a callable ``(uri, **options) -> BaseEventTrigger``). The result is
    the concrete trigger, so its ``serialize()`` names the concrete class.
    """
    scheme = urllib.parse.urlsplit(queue).scheme.lower()
    if scheme == "kafka":
        servers, topics = parse_kafka_uri(queue)
        return KafkaTrigger(bootstrap_servers=servers, topics=topics, **options)
    if scheme == "sqs" or (scheme in ("http", "https") and is_sqs_queue_url(queue)):
        return SqsTrigger(queue=queue, **options)
    providers = _provider_entry_points()
    if scheme in providers:
        provider: QueueProvider = providers[scheme].load()
        trigger = provider(queue, **options)
        if not isinstance(trigger, BaseEventTrigger):
            raise TypeError(
                f"queue provider {scheme!r} returned {trigger!r} for {queue!r}, "
                "not a BaseEventTrigger"
            )
        return trigger
    supported = ", ".join(sorted({*_BUILT_IN_SCHEMES, *providers}))
    raise ValueError(
        f"queue {queue!r} has no supported scheme; supported: {supported} "
        f"(e.g. {_KAFKA_FORM} or sqs://queue-name?region=..)"
    )


def parse_kafka_uri(uri: str) -> tuple[str, list[str]]:
    """The bootstrap servers (``host:port,...``) and topics of a ``kafka://`` URI."""
    parts = urllib.parse.urlsplit(uri)
    topics = [topic for topic in parts.path.strip("/").split(",") if topic]
    if not parts.netloc or not topics or "/" in parts.path.strip("/"):
        raise ValueError(f"Kafka URI {uri!r} must have the form {_KAFKA_FORM}")
    if parts.query or parts.fragment:
        raise ValueError(
            f"Kafka URI {uri!r} must not have a query or fragment; "
            "pass options as keyword arguments"
        )
    servers = []
    for server in parts.netloc.split(","):
        host, _, port = server.rpartition(":") if ":" in server else (server, "", "")
        if not host or (port and not port.isdigit()):
            raise ValueError(
                f"Kafka URI {uri!r}: bootstrap server {server!r} must be host or host:port"
            )
        servers.append(f"{host}:{port or DEFAULT_KAFKA_PORT}")
    return ",".join(servers), topics


def _provider_entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {
        entry_point.name.lower(): entry_point
        for entry_point in importlib.metadata.entry_points(group=PROVIDER_GROUP)
    }
