"""Google Pub/Sub watcher: ``PubSubTrigger``, its ``pubsub://PROJECT/SUBSCRIPTION`` URIs, the
producer ``send`` and ``PROVIDER``.

The pulling lives in :mod:`watchers.pubsub.puller`, which a trigger reads through with a
``ReaderSpec`` and whose ``ReaderStats`` hold its counters, lag and last poll; its acks and
deadlines in :mod:`watchers.pubsub.acks`; the clients, the puller's and ``send``'s, in
:mod:`watchers.pubsub.client`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from triggerer.providers import Provider
from watchers.clients import require
from watchers.processing import Processing, check_range
from watchers.pubsub import puller as pubsub_puller
from watchers.pubsub.client import connect
from watchers.pubsub.puller import (
    Reader,
    ReaderSpec,
    ReaderStats,
    missing,
)
from watchers.shared_readers import SharedReaderTrigger, shared_of_type
from watchers.uris import split_uri

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from triggerer.triggers import TriggerEvent

URI_FORM = "pubsub://PROJECT/SUBSCRIPTION"
#: A project id (optionally domain-scoped, ``example.com:project``).
_PROJECT = re.compile(r"(?:[a-z][a-z0-9.-]*[a-z0-9]:)?[a-z][a-z0-9-]{4,28}[a-z0-9]")
#: A subscription's name, as Pub/Sub takes it.
_SUBSCRIPTION = re.compile(r"[A-Za-z][A-Za-z0-9\-_.~+%]{2,254}")
_HOST_PORT = re.compile(r"[A-Za-z0-9.\-]+:\d{1,5}|\[[0-9A-Fa-f:.]+\]:\d{1,5}")
#: Messages in one Publish call (Pub/Sub takes up to 1,000, and 10 MB).
PUBLISH_BATCH = 500
PUBLISH_TIMEOUT_S = 60.0


def parse_pubsub_uri(uri: str) -> tuple[str, str]:
    """The project and subscription name of ``pubsub://PROJECT/SUBSCRIPTION``."""
    parts, _ = split_uri(uri, kind="Pub/Sub", form=URI_FORM, schemes=("pubsub",))
    project, subscription = parts.netloc, parts.path.removeprefix("/")
    if not project or not subscription or "/" in subscription:
        raise ValueError(f"Pub/Sub URI {uri!r} must have the form {URI_FORM}")
    if not _PROJECT.fullmatch(project):
        raise ValueError(
            f"Pub/Sub URI {uri!r}: project {project!r} is not a Google Cloud project id "
            "(6-30 lower-case letters, digits and hyphens, starting with a letter)"
        )
    if not _SUBSCRIPTION.fullmatch(subscription) or subscription.startswith("goog"):
        raise ValueError(
            f"Pub/Sub URI {uri!r}: subscription {subscription!r} is not a subscription name "
            "(3-255 letters, digits and - _ . ~ + %, starting with a letter, not with 'goog')"
        )
    return project, subscription


class PubSubTrigger(SharedReaderTrigger):
    """Yield one event per message of a Google Pub/Sub subscription.

    ``subscription`` is ``pubsub://PROJECT/SUBSCRIPTION``; the subscription must exist. The
    payload is ``{"message_id", "body", "attributes", "publish_time", "ordering_key",
    "delivery_attempt"}`` and the dedup key ``<subscription>/<message_id>@<publish_time>``
    (:func:`~watchers.pubsub.puller.dedup_key`). ``value_format`` (``"json"``, the default, or
    ``"avro"``, ``"protobuf"``, ``"json_schema"`` with ``schema_registry``) decodes the body
    (:mod:`watchers.schemas.decoding`): one that cannot be decoded is a dead letter at once; a
    registry that does not answer fails the watcher, the message not acknowledged. ``filter`` is
    checked on the payload, then ``apply_function`` (dotted path) may replace it; a message
    either drops is acknowledged. ``partition_key_path`` picks the partition key from the final
    payload.

    Pulls of up to ``max_messages`` run ``pullers`` at a time. A message is acknowledged once
    its event is committed (its ack); until then its ack deadline is extended, by
    ``ack_deadline_s`` (default: the subscription's). A message whose processing raises is
    nacked; under the subscription's dead-letter policy Pub/Sub forwards it to the dead-letter
    topic after the policy's attempts; without one, it becomes a dead letter of the daemon on
    its ``max_deliveries``-th delivery (counted in memory). Credentials: the ``connection``'s
    ``credentials_file``, else the application default credentials; ``emulator_host`` (or
    ``$PUBSUB_EMULATOR_HOST``) reads the emulator, without credentials.

    In the daemon, the triggers of one subscription share one puller: each sees every message,
    acknowledged once all of them are done with it. The puller's options (``max_messages``,
    ``pullers``, ``ack_deadline_s``, ``max_deliveries``) are those of its first watcher.
    """

    _stats: ReaderStats

    shareable = True

    def __init__(
        self,
        subscription: str,
        *,
        emulator_host: str | None = None,
        max_messages: int = 500,
        pullers: int = 2,
        ack_deadline_s: int | None = None,
        max_deliveries: int = 5,
        filter: dict[str, Any] | None = None,
        apply_function: str | None = None,
        partition_key_path: str | None = None,
        connection: str | None = None,
        value_format: str = "json",
        schema_registry: str | None = None,
    ) -> None:
        self.project, self.name = parse_pubsub_uri(subscription)
        if emulator_host is not None and not (
            isinstance(emulator_host, str) and _HOST_PORT.fullmatch(emulator_host)
        ):
            raise ValueError(f"emulator_host={emulator_host!r} must be 'host:port'")
        check_range("max_messages", max_messages, 1, 1000)
        check_range("pullers", pullers, 1, 16)
        check_range("max_deliveries", max_deliveries, 1, 1000)
        if ack_deadline_s is not None:
            check_range("ack_deadline_s", ack_deadline_s, 10, 600)
        if connection is not None and not (isinstance(connection, str) and connection):
            raise ValueError(f"connection={connection!r} must be the name of a connection")
        self._kwargs: dict[str, Any] = {
            "subscription": subscription,
            "emulator_host": emulator_host,
            "max_messages": max_messages,
            "pullers": pullers,
            "ack_deadline_s": ack_deadline_s,
            "max_deliveries": max_deliveries,
            "filter": filter,
            "apply_function": apply_function,
            "partition_key_path": partition_key_path,
            "connection": connection,
            "value_format": value_format,
            "schema_registry": schema_registry,
        }
        self._processing = Processing.of_kwargs(self._kwargs)
        self._stats = ReaderStats()
        self._reader: Reader | None = None

    @property
    def subscription_path(self) -> str:
        """``projects/PROJECT/subscriptions/NAME``."""
        return f"projects/{self.project}/subscriptions/{self.name}"

    def reader_spec(self) -> ReaderSpec:
        """What the subscription's puller needs of this trigger."""
        kwargs = self._kwargs
        return ReaderSpec(
            subscription=self.subscription_path,
            emulator_host=kwargs["emulator_host"],
            connection=kwargs["connection"],
            key=self.reader_key,
            decode=self._processing.decoded,
            prepare=self._processing.prepare,
            **self.options(pubsub_puller.PULLER_OPTIONS),
        )

    @property
    def reads_as(self) -> str | None:
        """The subscription it pulls from."""
        return self.subscription_path

    async def run(self) -> AsyncIterator[TriggerEvent]:
        await self.cleanup()
        self._processing.load()
        # On its own (outside the daemon), the trigger has a puller of its own.
        pullers = pubsub_puller.current() or pubsub_puller.Pullers()
        reader = self._reader = await pullers.join(self.reader_spec(), self._stats)
        while True:
            yield await reader.next_event()

    def same_message(self, stored: Any, received: Any) -> bool:
        """Equal payloads, but for the ``delivery_attempt`` a redelivery counts up."""
        return bool(_steady(stored) == _steady(received))


def _steady(payload: Any) -> Any:
    if isinstance(payload, dict) and "delivery_attempt" in payload:
        return {**payload, "delivery_attempt": None}
    return payload


# -- the producer: ``triggerer post pubsub URI MESSAGE...``


async def send(
    uri: str,
    bodies: Iterable[str | bytes],
    connection: str | None = None,
    *,
    attributes: Mapping[str, str] | None = None,
    emulator_host: str | None = None,
) -> list[str]:
    """Publish each of ``bodies`` (with ``attributes``) to the topic of the subscription at
    ``uri``; the message ids, in order. The emulator: ``emulator_host`` or
    ``$PUBSUB_EMULATOR_HOST``."""
    project, name = parse_pubsub_uri(uri)
    path = f"projects/{project}/subscriptions/{name}"
    exceptions = require("google.api_core.exceptions", "pubsub")
    types = require("google.pubsub_v1.types", "pubsub")
    messages = [
        types.PubsubMessage(
            data=body.encode() if isinstance(body, str) else body, attributes=attributes or {}
        )
        for body in bodies
    ]
    clients = await connect(emulator_host, connection, publisher=True)
    try:
        try:
            subscription = await clients.subscriber.get_subscription(subscription=path)
        except exceptions.NotFound:
            raise missing(path) from None
        topic = subscription.topic
        if topic == "_deleted-topic_":
            raise LookupError(f"Pub/Sub subscription {path!r} has lost its topic (deleted)")
        assert clients.publisher is not None  # noqa: S101 - asked for with publisher=True
        ids: list[str] = []
        for start in range(0, len(messages), PUBLISH_BATCH):
            response = await clients.publisher.publish(
                topic=topic,
                messages=messages[start : start + PUBLISH_BATCH],
                timeout=PUBLISH_TIMEOUT_S,
            )
            ids += response.message_ids
        return ids
    finally:
        await clients.aclose()


# -- the Pub/Sub provider: pubsub:// URIs, and the pullers its triggers share in one daemon


def _trigger_of_uri(uri: str, **options: Any) -> PubSubTrigger:
    return PubSubTrigger(uri, **options)


PROVIDER = Provider(
    name="pubsub",
    schemes=("pubsub",),
    trigger=_trigger_of_uri,
    shared=shared_of_type(pubsub_puller.Pullers, pubsub_puller.sharing, PubSubTrigger),
    send=send,
)

# A stored trigger keeps its key: serialize() writes the classpath a store holds from before the
# package, ``watchers.pubsub.PubSubTrigger``.
PubSubTrigger.__module__ = "watchers.pubsub"
