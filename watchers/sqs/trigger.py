"""Amazon SQS watcher: ``SqsTrigger``, its options and the payload of a message.

The queue addressing lives in ``watchers.sqs.address`` and the running machinery in
``watchers.sqs.session`` (receives; with ``in_flight``, ``deletes``, ``dead_letters`` and
``client`` beside it), which a trigger reads through with a ``ReaderSpec`` and whose
``ReaderStats`` hold its counters, lag and last poll. ``PROVIDER`` is the SQS provider.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from aiobotocore.config import AioConfig
from botocore.exceptions import BotoCoreError, ClientError

from triggerer.providers import Provider
from watchers import aws
from watchers.payloads import decode_body
from watchers.processing import Prepared, Processing, check_range
from watchers.shared_readers import SharedReaderTrigger, shared_of_type
from watchers.sqs import session as sqs_session
from watchers.sqs.address import is_sqs_queue_url, parse_queue
from watchers.sqs.client import MAX_MESSAGES, client_options, is_missing_queue
from watchers.sqs.session import Reader, ReaderSpec, ReaderStats

if TYPE_CHECKING:
    from triggerer.triggers import TriggerEvent
    from watchers.filters import PayloadFilter

MAX_WAIT_TIME_S = 20
MAX_VISIBILITY_TIMEOUT_S = 43_200


def message_payload(message: dict[str, Any]) -> dict[str, Any]:
    """The event payload of a received message.

    String and Number message attributes keep their text; Binary ones are decoded like the body.
    """
    return {
        "message_id": message["MessageId"],
        "body": decode_body(message.get("Body")),
        "attributes": dict(message.get("Attributes", {})),
        "message_attributes": {
            name: decode_body(value["BinaryValue"])
            if value["DataType"].startswith("Binary")
            else value.get("StringValue")
            for name, value in message.get("MessageAttributes", {}).items()
        },
    }


class SqsTrigger(SharedReaderTrigger):
    """Yield one event per SQS message, or per receive with ``batch=True``.

    ``queue`` is a queue URL, a queue name or ``sqs://name?region=..&endpoint_url=..``. The
    payload is ``{"message_id", "body", "attributes", "message_attributes"}`` (a batch:
    ``{"message_batch": [...]}``) and the dedup key ``<queue name>/<MessageId>``. ``receivers``
    long polls (``wait_time_s``, ``max_messages``) run at once. ``filter`` is checked on the
    payload, then ``transform`` (dotted path) may replace it; a message either drops is deleted
    and counted. ``partition_key_path`` picks the partition key from the final payload.

    An event's ack deletes its messages (batched); until then their visibility is extended by
    ``visibility_timeout_s`` (default: the queue's). A message whose processing raises is left
    for redelivery; on its ``max_receives``-th receive it goes to ``dead_letter_queue`` (default:
    the queue's RedrivePolicy target) with the reason in a message attribute, then is deleted.
    Credentials come from the named ``connection`` or the environment.

    In the daemon, the triggers of one queue share one poller (:mod:`watchers.sqs.session`):
    each sees every message, and a message is deleted once every watcher of the queue is done
    with it. The poller's options (``wait_time_s``, ``max_messages``, ``receivers``,
    ``visibility_timeout_s``, ``dead_letter_queue``, ``max_receives``) are those of the queue's
    first watcher; each watcher keeps its own ``filter``, ``transform``, ``batch`` and
    ``partition_key_path``.
    """

    _stats: ReaderStats

    shareable = True

    def __init__(
        self,
        queue: str,
        *,
        region_name: str | None = None,
        endpoint_url: str | None = None,
        wait_time_s: int = MAX_WAIT_TIME_S,
        max_messages: int = MAX_MESSAGES,
        receivers: int = 1,
        batch: bool = False,
        visibility_timeout_s: int | None = None,
        transform: str | None = None,
        filter: dict[str, Any] | None = None,
        partition_key_path: str | None = None,
        dead_letter_queue: str | None = None,
        max_receives: int = 5,
        connection: str | None = None,
    ) -> None:
        self.location = parse_queue(queue, region_name=region_name, endpoint_url=endpoint_url)
        check_range("wait_time_s", wait_time_s, 1, MAX_WAIT_TIME_S)
        check_range("max_messages", max_messages, 1, MAX_MESSAGES)
        check_range("receivers", receivers, 1, 64)
        check_range("max_receives", max_receives, 1, 1_000)
        if visibility_timeout_s is not None:
            check_range("visibility_timeout_s", visibility_timeout_s, 1, MAX_VISIBILITY_TIMEOUT_S)
        if not isinstance(batch, bool):
            raise ValueError(f"batch={batch!r} must be true or false")
        if dead_letter_queue is not None:
            parse_queue(dead_letter_queue)
        self._processing = Processing.of_options(
            filter=filter,
            apply_function=transform,
            partition_key_path=partition_key_path,
            option="transform",
        )
        # Imported now, not when the trigger runs: a transform that does not import, or is
        # async, is an error of the trigger's options.
        self._processing.load()
        payload_filter = self._processing.filter
        self._kwargs: dict[str, Any] = {
            "queue": queue,
            "region_name": region_name,
            "endpoint_url": endpoint_url,
            "wait_time_s": wait_time_s,
            "max_messages": max_messages,
            "receivers": receivers,
            "batch": batch,
            "visibility_timeout_s": visibility_timeout_s,
            "transform": transform,
            "filter": None if payload_filter is None else _filter_option(payload_filter),
            "partition_key_path": partition_key_path,
            "dead_letter_queue": dead_letter_queue,
            "max_receives": max_receives,
            "connection": connection,
        }
        # Written by the queue's session, since the trigger was made.
        self._stats = ReaderStats()
        self._reader: Reader | None = None

    def reader_spec(self) -> ReaderSpec:
        """What the queue's session needs of this trigger."""
        kwargs = self._kwargs
        return ReaderSpec(
            queue=self.location,
            connection=kwargs["connection"],
            key=self.reader_key,
            prepare=self._prepare,
            payload=message_payload,
            batch=kwargs["batch"],
            **self.options(sqs_session.POLLER_OPTIONS),
        )

    # Counters since the trigger was made: SharedReaderTrigger's and this one.

    @property
    def deleted(self) -> int:
        """Messages deleted from the queue (by this trigger's session)."""
        return self._stats.deleted

    async def run(self) -> AsyncIterator[TriggerEvent]:
        await self.cleanup()
        # On its own (outside the daemon), the trigger has a poller of its own.
        pollers = sqs_session.current() or sqs_session.Pollers()
        reader = self._reader = await pollers.join(self.reader_spec(), self._stats)
        try:
            while True:
                yield await reader.next_event()
        finally:
            reader.stop_reading()

    def same_message(self, stored: Any, received: Any) -> bool:
        """Equal payloads, but for the ``Approximate*`` attributes a redelivery changes."""
        return bool(_without_approximations(stored) == _without_approximations(received))

    def _prepare(self, message: dict[str, Any]) -> Prepared:
        """The payload and partition key of a message, or ``None`` when it is filtered out; what
        raises (a transform's result that is not JSON included) fails the message (retried,
        then dead-lettered), not the watcher."""
        return self._processing.prepare(message_payload(message))


def _without_approximations(payload: Any) -> Any:
    """``payload`` without the attributes SQS changes on each receive (the receive count)."""
    if not isinstance(payload, dict):
        return payload
    if isinstance(payload.get("message_batch"), list):
        return [_without_approximations(item) for item in payload["message_batch"]]
    attributes = payload.get("attributes")
    if not isinstance(attributes, dict):
        return payload
    steady = {name: value for name, value in attributes.items() if not name.startswith("Approx")}
    return {**payload, "attributes": steady}


def _filter_option(payload_filter: PayloadFilter) -> dict[str, Any]:
    if payload_filter.one_of:
        return {"path": payload_filter.path, "one_of": list(payload_filter.one_of)}
    return {"path": payload_filter.path, "equals": payload_filter.equals}


# -- the SQS provider: sqs:// URIs and queue URLs, the pollers its triggers share, send


def _trigger_of_uri(uri: str, **options: Any) -> SqsTrigger:
    if uri.lower().startswith(("http://", "https://")) and not is_sqs_queue_url(uri):
        raise ValueError(
            f"queue {uri!r} is not an SQS queue URL: give https://sqs.<region>.amazonaws.com/"
            "<account>/<name>, sqs://queue-name?region=.. or another provider's URI"
        )
    return SqsTrigger(queue=uri, **options)


_MAX_SEND_ATTEMPTS = 3
#: A sender waits for an answer, not for a long poll: a few seconds tell an endpoint is down.
_SEND_CONFIG = AioConfig(connect_timeout=5, read_timeout=30, retries={"mode": "standard"})


async def send(
    uri: str,
    bodies: Iterable[str],
    connection: str | None = None,
    *,
    region_name: str | None = None,
    endpoint_url: str | None = None,
    attributes: Mapping[str, str] | None = None,
) -> list[str]:
    """Send each body as one message to the queue at ``uri`` (URL, ``sqs://`` URI or name;
    ``region_name`` and ``endpoint_url`` fill what it leaves out), in batches of ten.

    ``attributes`` become String message attributes of every message. Returns the message ids,
    in the order of ``bodies``.
    """
    location = parse_queue(uri, region_name=region_name, endpoint_url=endpoint_url)
    texts = list(bodies)
    message_attributes = {
        name: {"DataType": "String", "StringValue": value}
        for name, value in (attributes or {}).items()
    }
    fifo = location.name.endswith(".fifo")
    shown = location.url or location.name
    async with aws.session().create_client(
        "sqs", config=_SEND_CONFIG, **client_options(location, connection)
    ) as client:
        try:
            url = location.url or (await client.get_queue_url(QueueName=location.name))["QueueUrl"]
            ids: list[str] = []
            for start in range(0, len(texts), MAX_MESSAGES):
                entries = [
                    {"Id": str(start + number), "MessageBody": body}
                    | ({"MessageAttributes": message_attributes} if message_attributes else {})
                    | (
                        {
                            "MessageGroupId": location.name,
                            "MessageDeduplicationId": uuid.uuid4().hex,
                        }
                        if fifo
                        else {}
                    )
                    for number, body in enumerate(texts[start : start + MAX_MESSAGES])
                ]
                ids += await _send_batch(client, url, entries)
        except ClientError as error:
            if is_missing_queue(error):
                raise LookupError(
                    f"SQS queue {location.name!r} does not exist at {client.meta.endpoint_url} "
                    f"(region {client.meta.region_name}); create it first"
                ) from None
            raise ConnectionError(
                f"SQS at {client.meta.endpoint_url}, queue {shown!r}: {error}"
            ) from None
        except BotoCoreError as error:  # unreachable endpoint, no credentials
            raise ConnectionError(
                f"SQS at {client.meta.endpoint_url}, queue {shown!r}: {error}"
            ) from None
    return ids


async def _send_batch(client: Any, url: str, entries: list[dict[str, Any]]) -> list[str]:
    """Send one batch; entries the service failed on its side are sent again."""
    ids: dict[str, str] = {}
    pending = entries
    for _ in range(_MAX_SEND_ATTEMPTS):
        response = await client.send_message_batch(QueueUrl=url, Entries=pending)
        ids |= {sent["Id"]: sent["MessageId"] for sent in response.get("Successful", [])}
        failed = response.get("Failed", [])
        rejected = [failure for failure in failed if failure.get("SenderFault")]
        if rejected:
            raise ValueError(f"SQS rejected messages {rejected!r} sent to {url}")
        retry = {failure["Id"] for failure in failed}
        pending = [entry for entry in pending if entry["Id"] in retry]
        if not pending:
            return [ids[entry["Id"]] for entry in entries]
    raise RuntimeError(
        f"SQS failed to take {len(pending)} messages sent to {url} after "
        f"{_MAX_SEND_ATTEMPTS} attempts: {failed!r}"
    )


PROVIDER = Provider(
    name="sqs",
    schemes=("sqs", "https", "http"),
    trigger=_trigger_of_uri,
    shared=shared_of_type(sqs_session.Pollers, sqs_session.sharing, SqsTrigger),
    send=send,
)

# A stored trigger keeps its key: serialize() writes the classpath a store holds from before the
# package, ``watchers.sqs.SqsTrigger``.
SqsTrigger.__module__ = "watchers.sqs"
