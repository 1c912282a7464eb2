"""Amazon SQS watcher: long polls, batched deletes, visibility extension and dead letters."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import json
import random
import re
import time
import urllib.parse
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any

import structlog
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from triggerer.connections import get_connection
from triggerer.triggers import BaseEventTrigger, TriggerEvent
from watchers.filters import PayloadFilter, lookup, parse_path
from watchers.payloads import decode_body, import_callable

log = structlog.get_logger(__name__)

MAX_WAIT_TIME_S = 20
MAX_MESSAGES = 10
MAX_VISIBILITY_TIMEOUT_S = 43_200
DELETE_WINDOW_S = 0.005  # acks arriving within this window share one DeleteMessageBatch
CLEANUP_TIMEOUT_S = 10.0
DEAD_LETTER_REASON_ATTRIBUTE = "triggerer_dead_letter_reason"
DEAD_LETTER_SOURCE_ATTRIBUTE = "triggerer_source_queue"
_MAX_MESSAGE_ATTRIBUTES = 10
_MAX_REASON_CHARS = 1_000
_THROTTLING_CODES = frozenset(
    {"Throttling", "ThrottlingException", "RequestThrottled", "ServiceUnavailable"}
)
_QUEUE_NAME = re.compile(r"[A-Za-z0-9_-]{1,80}(\.fifo)?")
_AWS_HOST = re.compile(r"sqs\.([a-z0-9-]+)\.amazonaws\.com(\.cn)?")
_CREDENTIAL_KEYS = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")
_SQS_URI_FORM = "sqs://queue-name?region=..&endpoint_url=.."


@dataclasses.dataclass(frozen=True)
class SqsQueue:
    """Where a queue lives: its name, its URL when given, region and endpoint."""

    name: str
    url: str | None = None
    region_name: str | None = None
    endpoint_url: str | None = None


def parse_queue(
    queue: str, *, region_name: str | None = None, endpoint_url: str | None = None
) -> SqsQueue:
    """Parse a queue name, a queue URL or an ``sqs://`` URI; keyword arguments fill the gaps.

    A region or endpoint given both in the URI and as a keyword must agree.
    """
    parts = urllib.parse.urlsplit(queue)
    scheme = parts.scheme.lower()
    if scheme == "sqs":
        if parts.path not in ("", "/") or not parts.netloc:
            raise ValueError(f"SQS URI {queue!r} must have the form {_SQS_URI_FORM}")
        options = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
        unknown = set(options) - {"region", "endpoint_url"}
        if unknown:
            raise ValueError(
                f"SQS URI {queue!r} has unknown options {sorted(unknown)}; "
                "valid: region, endpoint_url"
            )
        name = _check_name(parts.netloc, queue)
        region = _agree(queue, "region", options.get("region"), region_name)
        endpoint = _agree(queue, "endpoint_url", options.get("endpoint_url"), endpoint_url)
        return SqsQueue(name, None, region, endpoint)
    if scheme in ("http", "https"):
        segments = [segment for segment in parts.path.split("/") if segment]
        if not segments:
            raise ValueError(
                f"SQS queue URL {queue!r} has no queue name; expected "
                "https://sqs.<region>.amazonaws.com/<account>/<name>"
            )
        name = _check_name(segments[-1], queue)
        host = _AWS_HOST.fullmatch(parts.hostname or "")
        if host is not None:
            return SqsQueue(name, queue, _agree(queue, "region", host.group(1), region_name), None)
        return SqsQueue(name, queue, region_name, endpoint_url or f"{scheme}://{parts.netloc}")
    if not parts.scheme and _QUEUE_NAME.fullmatch(queue):
        return SqsQueue(queue, None, region_name, endpoint_url)
    raise ValueError(
        f"SQS queue {queue!r} is not a queue name, a queue URL "
        f"(https://sqs.<region>.amazonaws.com/<account>/<name>) or a URI ({_SQS_URI_FORM})"
    )


def is_sqs_queue_url(url: str) -> bool:
    """Whether an http(s) URL looks like an SQS queue URL (AWS host, or ``/<account>/<name>``)."""
    parts = urllib.parse.urlsplit(url)
    if _AWS_HOST.fullmatch(parts.hostname or ""):
        return True
    return re.fullmatch(r"/\d{12}/[A-Za-z0-9_.-]+/?", parts.path) is not None


def _check_name(name: str, queue: str) -> str:
    if not _QUEUE_NAME.fullmatch(name):
        raise ValueError(
            f"SQS queue {queue!r}: queue name {name!r} must be 1-80 letters, digits, '-' or '_' "
            "(with '.fifo' for a FIFO queue)"
        )
    return name


def _agree(queue: str, option: str, in_uri: str | None, keyword: str | None) -> str | None:
    if in_uri and keyword and in_uri != keyword:
        raise ValueError(f"SQS queue {queue!r} says {option}={in_uri!r} but {keyword!r} was given")
    return in_uri or keyword


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


class SqsTrigger(BaseEventTrigger):
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
    """

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
        _check_range("wait_time_s", wait_time_s, 1, MAX_WAIT_TIME_S)
        _check_range("max_messages", max_messages, 1, MAX_MESSAGES)
        _check_range("receivers", receivers, 1, 64)
        _check_range("max_receives", max_receives, 1, 1_000)
        if visibility_timeout_s is not None:
            _check_range("visibility_timeout_s", visibility_timeout_s, 1, MAX_VISIBILITY_TIMEOUT_S)
        if not isinstance(batch, bool):
            raise ValueError(f"batch={batch!r} must be true or false")
        if dead_letter_queue is not None:
            parse_queue(dead_letter_queue)
        if partition_key_path is not None:
            parse_path(partition_key_path)
        self._filter = None if filter is None else PayloadFilter.from_option(filter)
        self._transform = (
            None if transform is None else import_callable(transform, option="transform")
        )
        if inspect.iscoroutinefunction(self._transform):
            raise ValueError(f"transform={transform!r} must be a plain function, not async")
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
            "filter": None if self._filter is None else _filter_option(self._filter),
            "partition_key_path": partition_key_path,
            "dead_letter_queue": dead_letter_queue,
            "max_receives": max_receives,
            "connection": connection,
        }
        #: Counters for the daemon's ``/watchers`` since the trigger was made: messages received,
        #: events yielded, messages filtered, failing, sent to the dead-letter queue, deleted.
        self.received = 0
        self.events = 0
        self.filtered = 0
        self.failed = 0
        self.dead_lettered = 0
        self.deleted = 0
        self._session: _SqsSession | None = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), dict(self._kwargs)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        await self.cleanup()
        self._session = session = _SqsSession(self)
        await session.open()
        try:
            while True:
                yield await session.next_event()
        finally:
            session.stop_receiving()

    async def cleanup(self) -> None:
        """Flush pending deletes, make unacked messages visible again and close the client."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def _prepare(self, message: dict[str, Any]) -> tuple[Any, str | None] | None:
        """The payload and partition key of a message, or ``None`` when it is filtered out."""
        payload: Any = message_payload(message)
        if self._filter is not None and not self._filter.matches(payload):
            return None
        if self._transform is not None:
            payload = self._transform(payload)
            if payload is None:
                return None
            json.dumps(payload)  # not JSON-serialisable: a failing message, not a failing watcher
        return payload, self._partition_key(payload)

    def _partition_key(self, payload: Any) -> str | None:
        path = self._kwargs["partition_key_path"]
        if path is None:
            return None
        value = lookup(payload, path)
        if isinstance(value, str):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        raise ValueError(f"partition_key_path {path!r} does not lead to a text or integer value")


def _check_range(option: str, value: int, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{option}={value!r} must be an integer from {low} to {high}")


def _filter_option(payload_filter: PayloadFilter) -> dict[str, Any]:
    if payload_filter.one_of:
        return {"path": payload_filter.path, "one_of": list(payload_filter.one_of)}
    return {"path": payload_filter.path, "equals": payload_filter.equals}


@dataclasses.dataclass(eq=False)
class _InFlight:
    """A received message this process holds: extended until deleted or released."""

    message_id: str
    receipt_handle: str
    visible_until: float  # time.monotonic() when SQS would make it visible again
    acked: bool = False


@dataclasses.dataclass(frozen=True)
class _Failure:
    error: BaseException


class _SqsSession:
    """One ``run()`` of a trigger: the client, the receive loops and the background tasks."""

    def __init__(self, trigger: SqsTrigger) -> None:
        self._trigger = trigger
        self._options = trigger.serialize()[1]
        self._name = trigger.location.name
        self._log = log.bind(queue=self._name)
        self._exit_stack = contextlib.AsyncExitStack()
        self._client: Any = None
        self._queue_url = ""
        self._dead_letter_url: str | None = None
        self._visibility_timeout_s = 30
        self._max_receives: int = self._options["max_receives"]
        self._in_flight: dict[str, _InFlight] = {}
        self._in_flight_added = asyncio.Event()
        self._pending_deletes: list[_InFlight] = []
        self._deletes_ready = asyncio.Event()
        self._deletes_full = asyncio.Event()
        self._delete_concurrency = max(2, self._options["receivers"])
        self._delete_slots = asyncio.Semaphore(self._delete_concurrency)
        self._delete_tasks: set[asyncio.Task[None]] = set()
        self._events: asyncio.Queue[TriggerEvent | _Failure] = asyncio.Queue()
        buffer = self._options["receivers"] * (1 if self._options["batch"] else MAX_MESSAGES)
        self._buffer_slots = asyncio.Semaphore(buffer)
        self._receivers: list[asyncio.Task[None]] = []
        self._background: list[asyncio.Task[None]] = []
        self._opened = False
        self._closed = False

    async def open(self) -> None:
        try:
            await self._connect()
        except BaseException:
            self._closed = True
            await self._exit_stack.aclose()
            raise
        self._opened = True
        self._background = [
            self._spawn(self._extend_loop(), "sqs-extend"),
            self._spawn(self._delete_loop(), "sqs-delete"),
        ]
        self._receivers = [
            self._spawn(self._receive_loop(), f"sqs-receive-{number}")
            for number in range(self._options["receivers"])
        ]
        self._log.info(
            "sqs_watcher_started",
            queue_url=self._queue_url,
            receivers=len(self._receivers),
            visibility_timeout_s=self._visibility_timeout_s,
            dead_letter_queue=self._dead_letter_url,
            max_receives=self._max_receives,
        )

    async def _connect(self) -> None:
        location = self._trigger.location
        connection = self._options["connection"]
        settings = {} if connection is None else get_connection(connection)
        credentials = {key: settings[key] for key in _CREDENTIAL_KEYS if key in settings}
        region = location.region_name or settings.get("region_name")
        endpoint = location.endpoint_url or settings.get("endpoint_url")
        config = AioConfig(
            max_pool_connections=self._options["receivers"] + self._delete_concurrency + 2,
            read_timeout=self._options["wait_time_s"] + 30,
            retries={"mode": "standard"},
        )
        self._client = await self._exit_stack.enter_async_context(
            get_session().create_client(
                "sqs", region_name=region, endpoint_url=endpoint, config=config, **credentials
            )
        )
        self._queue_url = location.url or await self._queue_url_of(location.name)
        with self._missing_queue(self._queue_url):
            response = await self._call(
                "get_queue_attributes",
                QueueUrl=self._queue_url,
                AttributeNames=["VisibilityTimeout", "RedrivePolicy"],
            )
        attributes = response.get("Attributes", {})
        # A queue may say 0 (visible at once); holding a message needs some time.
        self._visibility_timeout_s = (
            self._options["visibility_timeout_s"]
            or int(attributes.get("VisibilityTimeout", 0))
            or 30
        )
        await self._resolve_dead_letter_queue(attributes.get("RedrivePolicy"))

    async def _queue_url_of(self, name: str, account: str | None = None) -> str:
        arguments = {"QueueName": name}
        if account is not None:
            arguments["QueueOwnerAWSAccountId"] = account
        with self._missing_queue(name):
            response = await self._call("get_queue_url", **arguments)
        url: str = response["QueueUrl"]
        return url

    @contextlib.contextmanager
    def _missing_queue(self, queue: str) -> Iterator[None]:
        """Turn the service's "no such queue" into a ``LookupError`` naming the queue."""
        try:
            yield
        except ClientError as error:
            if not is_missing_queue(error):
                raise
            raise LookupError(
                f"SQS queue {queue!r} does not exist at {self._client.meta.endpoint_url} "
                f"(region {self._client.meta.region_name}); create it or fix the queue name"
            ) from error

    async def _resolve_dead_letter_queue(self, redrive_policy: str | None) -> None:
        """Use ``dead_letter_queue``, else the queue's redrive target (capping ``max_receives``)."""
        if self._options["dead_letter_queue"] is not None:
            target = parse_queue(self._options["dead_letter_queue"])
            self._dead_letter_url = target.url or await self._queue_url_of(target.name)
            return
        if redrive_policy is None:
            return
        policy = json.loads(redrive_policy)
        *_, account, name = policy["deadLetterTargetArn"].split(":")
        self._dead_letter_url = await self._queue_url_of(name, account)
        redrive_receives = int(policy["maxReceiveCount"])
        if redrive_receives < self._max_receives:
            # SQS would move the message first, without our reason attribute.
            self._log.warning(
                "sqs_max_receives_lowered",
                max_receives=self._max_receives,
                redrive_max_receive_count=redrive_receives,
            )
            self._max_receives = redrive_receives

    async def next_event(self) -> TriggerEvent:
        item = await self._events.get()
        if isinstance(item, _Failure):
            raise item.error
        self._buffer_slots.release()
        return item

    def stop_receiving(self) -> None:
        for task in self._receivers:
            task.cancel()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.stop_receiving()
        extend_loop, delete_loop = self._background
        try:
            async with asyncio.timeout(CLEANUP_TIMEOUT_S):
                await _cancel_and_wait([*self._receivers, delete_loop])
                await self._flush_deletes()
                await _cancel_and_wait([extend_loop])
                await self._release_unacked()
        except TimeoutError:
            self._log.warning(
                "sqs_cleanup_timed_out",
                pending_deletes=len(self._pending_deletes),
                in_flight=len(self._in_flight),
            )
        finally:
            await _cancel_and_wait([extend_loop, *self._delete_tasks])
            await self._exit_stack.aclose()
        trigger = self._trigger
        self._log.info(
            "sqs_watcher_stopped",
            received=trigger.received,
            events=trigger.events,
            filtered=trigger.filtered,
            failed=trigger.failed,
            dead_lettered=trigger.dead_lettered,
            deleted=trigger.deleted,
        )

    def _spawn(self, coroutine: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.create_task(coroutine, name=name)
        task.add_done_callback(self._on_task_done)
        return task

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            self._events.put_nowait(_Failure(error))

    async def _call(self, operation: str, **arguments: Any) -> dict[str, Any]:
        """Call the SQS API, retrying transient errors with jittered exponential backoff.

        Until the session is open an error is raised at once (after botocore's own retries):
        a watcher that cannot start fails, and the supervisor shows the error and restarts it.
        """
        attempt = 0
        while True:
            try:
                response: dict[str, Any] = await getattr(self._client, operation)(**arguments)
            except (ClientError, HTTPClientError, BotoConnectionError) as error:
                if not (self._opened and _is_transient(error)):
                    raise
                attempt += 1
                jitter = random.uniform(0.5, 1.0)  # noqa: S311 - spreads retries, not a secret
                delay_s = min(10.0, 0.1 * 2**attempt) * jitter
                self._log.warning(
                    "sqs_call_failed",
                    operation=operation,
                    error=str(error),
                    attempt=attempt,
                    retry_in_s=round(delay_s, 2),
                )
                await asyncio.sleep(delay_s)
            else:
                return response

    async def _receive_loop(self) -> None:
        arguments: dict[str, Any] = {
            "QueueUrl": self._queue_url,
            "MaxNumberOfMessages": self._options["max_messages"],
            "WaitTimeSeconds": self._options["wait_time_s"],
            "MessageSystemAttributeNames": ["All"],
            "MessageAttributeNames": ["All"],
            "VisibilityTimeout": self._visibility_timeout_s,
        }
        while True:
            sent_at = time.monotonic()
            response = await self._call("receive_message", **arguments)
            messages: list[dict[str, Any]] = response.get("Messages", [])
            if not messages:
                continue
            self._trigger.received += len(messages)
            held = [self._hold(message, sent_at) for message in messages]
            for event in await self._events_of(messages, held):
                self._trigger.events += 1
                await self._buffer_slots.acquire()
                self._events.put_nowait(event)

    def _hold(self, message: dict[str, Any], sent_at: float) -> _InFlight:
        entry = _InFlight(
            message["MessageId"], message["ReceiptHandle"], sent_at + self._visibility_timeout_s
        )
        self._in_flight[entry.receipt_handle] = entry
        self._in_flight_added.set()
        return entry

    async def _events_of(
        self, messages: list[dict[str, Any]], held: list[_InFlight]
    ) -> list[TriggerEvent]:
        """Events for the messages that pass; filtered ones are deleted, failing ones handled."""
        kept: list[tuple[Any, str | None, _InFlight]] = []
        for message, entry in zip(messages, held, strict=True):
            try:
                prepared = self._trigger._prepare(message)
            # A user's transform may raise anything: a bad message must not stop the watcher;
            # it is retried, then dead-lettered with the reason.
            except Exception as error:  # noqa: BLE001
                await self._failed(message, entry, error)
                continue
            if prepared is None:
                self._trigger.filtered += 1
                self._delete_later(entry)
                continue
            payload, partition_key = prepared
            kept.append((payload, partition_key, entry))
        if not self._options["batch"]:
            return [self._event(payload, key, [entry]) for payload, key, entry in kept]
        groups: dict[str | None, list[tuple[Any, _InFlight]]] = {}
        for payload, key, entry in kept:
            groups.setdefault(key, []).append((payload, entry))
        return [
            self._event(
                {"message_batch": [payload for payload, _ in items]},
                key,
                [entry for _, entry in items],
            )
            for key, items in groups.items()
        ]

    def _event(
        self, payload: Any, partition_key: str | None, entries: list[_InFlight]
    ) -> TriggerEvent:
        ids = ",".join(entry.message_id for entry in entries)

        async def ack() -> None:
            self._ack(entries)

        return TriggerEvent(
            payload, dedup_key=f"{self._name}/{ids}", ack=ack, partition_key=partition_key
        )

    def _ack(self, entries: list[_InFlight]) -> None:
        if self._closed:
            # The messages were made visible again at cleanup: redelivered, then deduplicated.
            self._log.warning("sqs_ack_after_cleanup", message_ids=[e.message_id for e in entries])
            return
        for entry in entries:
            if not entry.acked:
                self._delete_later(entry)

    def _delete_later(self, entry: _InFlight) -> None:
        entry.acked = True
        self._pending_deletes.append(entry)
        self._deletes_ready.set()
        if len(self._pending_deletes) >= MAX_MESSAGES:
            self._deletes_full.set()

    async def _failed(self, message: dict[str, Any], entry: _InFlight, error: Exception) -> None:
        """Leave a failing message for redelivery, or dead-letter it after ``max_receives``."""
        self._trigger.failed += 1
        self._in_flight.pop(entry.receipt_handle, None)
        reason = f"{type(error).__name__}: {error}"[:_MAX_REASON_CHARS]
        receives = int(message.get("Attributes", {}).get("ApproximateReceiveCount", 1))
        if receives < self._max_receives:
            self._log.warning(
                "sqs_message_failed",
                message_id=entry.message_id,
                reason=reason,
                receives=receives,
                max_receives=self._max_receives,
            )
            return
        if self._dead_letter_url is None:
            self._log.error(
                "sqs_message_not_dead_lettered",
                message_id=entry.message_id,
                reason=reason,
                receives=receives,
                why="no dead_letter_queue and no RedrivePolicy: it stays in the queue",
            )
            return
        try:
            await self._call("send_message", **self._dead_letter_message(message, reason))
        except ClientError as send_error:
            self._log.error(
                "sqs_dead_letter_failed",
                message_id=entry.message_id,
                reason=reason,
                error=str(send_error),
                why="it stays in the queue and is retried on its next receive",
            )
            return
        self._trigger.dead_lettered += 1
        self._log.error(
            "sqs_message_dead_lettered",
            message_id=entry.message_id,
            reason=reason,
            receives=receives,
            dead_letter_queue=self._dead_letter_url,
        )
        self._in_flight[entry.receipt_handle] = entry
        self._delete_later(entry)

    def _dead_letter_message(self, message: dict[str, Any], reason: str) -> dict[str, Any]:
        ours = {
            DEAD_LETTER_REASON_ATTRIBUTE: {"DataType": "String", "StringValue": reason},
            DEAD_LETTER_SOURCE_ATTRIBUTE: {"DataType": "String", "StringValue": self._queue_url},
        }
        theirs = list(message.get("MessageAttributes", {}).items())
        theirs = theirs[: _MAX_MESSAGE_ATTRIBUTES - len(ours)]
        arguments: dict[str, Any] = {
            "QueueUrl": self._dead_letter_url,
            "MessageBody": message.get("Body", ""),
            "MessageAttributes": {**dict(theirs), **ours},
        }
        if (self._dead_letter_url or "").endswith(".fifo"):
            attributes = message.get("Attributes", {})
            arguments["MessageGroupId"] = attributes.get("MessageGroupId", self._name)
            arguments["MessageDeduplicationId"] = message["MessageId"]
        return arguments

    async def _delete_loop(self) -> None:
        while True:
            await self._deletes_ready.wait()
            if len(self._pending_deletes) < MAX_MESSAGES:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(DELETE_WINDOW_S):
                        await self._deletes_full.wait()
            await self._delete_slots.acquire()
            batch = self._take_deletes()
            task = asyncio.create_task(self._delete_batch(batch), name="sqs-delete-batch")
            self._delete_tasks.add(task)
            task.add_done_callback(self._delete_batch_done)

    def _take_deletes(self) -> list[_InFlight]:
        batch = self._pending_deletes[:MAX_MESSAGES]
        del self._pending_deletes[:MAX_MESSAGES]
        if len(self._pending_deletes) < MAX_MESSAGES:
            self._deletes_full.clear()
        if not self._pending_deletes:
            self._deletes_ready.clear()
        return batch

    def _delete_batch_done(self, task: asyncio.Task[None]) -> None:
        self._delete_tasks.discard(task)
        self._delete_slots.release()
        self._on_task_done(task)

    async def _delete_batch(self, batch: list[_InFlight], *, attempt: int = 0) -> None:
        """Delete up to ten messages; entries that failed on the server side are retried."""
        entries = [
            {"Id": str(number), "ReceiptHandle": entry.receipt_handle}
            for number, entry in enumerate(batch)
        ]
        response = await self._call(
            "delete_message_batch", QueueUrl=self._queue_url, Entries=entries
        )
        retry = []
        for failure in response.get("Failed", []):
            entry = batch[int(failure["Id"])]
            if failure.get("SenderFault"):
                # The receipt handle expired: SQS redelivers the message and its dedup key
                # keeps a second event out.
                self._log.warning(
                    "sqs_delete_rejected",
                    message_id=entry.message_id,
                    code=failure.get("Code"),
                    error=failure.get("Message"),
                )
                self._in_flight.pop(entry.receipt_handle, None)
            else:
                retry.append(entry)
        done = len(batch) - len(retry)
        self._trigger.deleted += len(response.get("Successful", []))
        for entry in batch:
            if entry not in retry:
                self._in_flight.pop(entry.receipt_handle, None)
        if retry:
            delay_s = min(10.0, 0.1 * 2 ** (attempt + 1))
            self._log.warning(
                "sqs_delete_retrying", failed=len(retry), deleted=done, retry_in_s=delay_s
            )
            await asyncio.sleep(delay_s)
            await self._delete_batch(retry, attempt=attempt + 1)

    async def _flush_deletes(self) -> None:
        """Delete everything acked so far: wait for the running batches, then send the rest."""
        while self._delete_tasks or self._pending_deletes:
            if self._delete_tasks:
                await asyncio.wait(list(self._delete_tasks))
            batch = self._take_deletes()
            if batch:
                await self._delete_batch(batch)

    async def _extend_loop(self) -> None:
        """Keep held messages invisible: renew each one when half its visibility is used up."""
        margin_s = self._visibility_timeout_s / 2
        while True:
            now = time.monotonic()
            due = [e for e in self._in_flight.values() if e.visible_until - now <= margin_s]
            if not due:
                self._in_flight_added.clear()
                next_due = min((e.visible_until for e in self._in_flight.values()), default=None)
                timeout_s = None if next_due is None else next_due - margin_s - now
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout_s):
                        await self._in_flight_added.wait()
                continue
            for start in range(0, len(due), MAX_MESSAGES):
                await self._change_visibility(
                    due[start : start + MAX_MESSAGES], self._visibility_timeout_s
                )

    async def _change_visibility(self, batch: list[_InFlight], timeout_s: int) -> None:
        sent_at = time.monotonic()
        response = await self._call(
            "change_message_visibility_batch",
            QueueUrl=self._queue_url,
            Entries=[
                {
                    "Id": str(number),
                    "ReceiptHandle": entry.receipt_handle,
                    "VisibilityTimeout": timeout_s,
                }
                for number, entry in enumerate(batch)
            ],
        )
        for entry in batch:
            entry.visible_until = sent_at + timeout_s
        for failure in response.get("Failed", []):
            entry = batch[int(failure["Id"])]
            if self._in_flight.pop(entry.receipt_handle, None) is None:
                continue  # deleted while the call was on its way
            # Past the 12-hour limit, or the handle expired: SQS redelivers the message.
            self._log.warning(
                "sqs_visibility_change_failed",
                message_id=entry.message_id,
                code=failure.get("Code"),
                error=failure.get("Message"),
            )

    async def _release_unacked(self) -> None:
        """Make messages this process will never ack visible again at once."""
        unacked = [entry for entry in self._in_flight.values() if not entry.acked]
        self._in_flight.clear()
        for start in range(0, len(unacked), MAX_MESSAGES):
            await self._change_visibility(unacked[start : start + MAX_MESSAGES], 0)


def _is_transient(error: Exception) -> bool:
    if isinstance(error, ClientError):
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return bool(status >= 500 or _error_code(error) in _THROTTLING_CODES)
    return True


def is_missing_queue(error: ClientError) -> bool:
    """Whether the service answered that the queue does not exist."""
    return _error_code(error) in ("AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist")


def _error_code(error: ClientError) -> str:
    code: str = error.response.get("Error", {}).get("Code", "")
    return code


async def _cancel_and_wait(tasks: list[asyncio.Task[None]] | set[asyncio.Task[None]]) -> None:
    """Cancel ``tasks`` and wait for them; their own errors were already reported."""
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
