"""Amazon Kinesis watcher: ``KinesisTrigger`` reads the shards of a stream and keeps its place
in the metadata database, with its events; ``send`` puts records; ``PROVIDER``.

Kinesis has no acknowledgement: a reader keeps its place (a sequence number per shard) itself.
Each event carries its record's place (``TriggerEvent.checkpoint``), which the daemon stores in
the transaction of the event, so a watcher that starts again reads on after exactly what is
stored, and a record read again before that commit is absorbed by its dedup key. The shards
themselves are read by :class:`watchers.kinesis.reader.ShardReader`; the daemons on one store
share them out, a lease per shard (:mod:`watchers.kinesis.sharing`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import structlog

from triggerer.backoff import backoff_s
from triggerer.providers import Provider
from triggerer.triggers import SourceMissing, TriggerEvent, WatchedAsset
from watchers import cloudevents
from watchers.first_start import STARTED, first_start
from watchers.kinesis.sharing import ENDED, ENDED_MARK, ShardSharing, stored_state
from watchers.payloads import decode_body
from watchers.processing import (
    ADDED_LATER,
    UNREADABLE,
    LaterOptionsTrigger,
    Processing,
    check_range,
)
from watchers.uris import split_uri

if TYPE_CHECKING:
    from triggerer.part_leases import Fence
    from watchers.kinesis.reader import KinesisClient

log = structlog.get_logger(__name__)

_STREAM_NAME = re.compile(r"[a-zA-Z0-9_.-]{1,128}")
_FORM = "kinesis://STREAM?region=..&endpoint_url=.."
STARTS = ("TRIM_HORIZON", "LATEST")
MAX_RECORDS_PER_READ = 10_000
MAX_RECORDS_PER_PUT = 500
_PUT_ATTEMPTS = 8
DEFAULT_APPLICATION = "triggerer"
"""The name a trigger run on its own reads as (in the daemon: one derived from its watcher)."""


def parse_kinesis_uri(uri: str) -> tuple[str, str | None, str | None]:
    """The stream, region and endpoint of ``kinesis://STREAM?region=..&endpoint_url=..``."""
    parts, options = split_uri(
        uri, kind="Kinesis", form=_FORM, schemes=("kinesis",), options=("region", "endpoint_url")
    )
    if parts.path not in ("", "/") or not parts.netloc:
        raise ValueError(f"Kinesis URI {uri!r} must have the form {_FORM}")
    return (
        check_stream_name(parts.netloc, uri),
        options.get("region") or None,
        options.get("endpoint_url") or None,
    )


def check_stream_name(name: str, where: str) -> str:
    if not _STREAM_NAME.fullmatch(name):
        raise ValueError(
            f"Kinesis stream {name!r} (in {where!r}) must be 1-128 letters, digits, '_', '-' or '.'"
        )
    return name


def record_payload(record: dict[str, Any], shard_id: str) -> dict[str, Any]:
    """The event payload of a record: its data decoded (JSON, else text, else base64)."""
    arrival = record.get("ApproximateArrivalTimestamp")
    return {
        "body": decode_body(record.get("Data")),
        "partition_key": record.get("PartitionKey"),
        "sequence_number": record["SequenceNumber"],
        "shard_id": shard_id,
        "approximate_arrival": None if arrival is None else arrival.timestamp(),
    }


def watcher_application(asset: WatchedAsset, watcher_name: str) -> str:
    """The name a watcher reads a stream as by default: ``triggerer-<watcher>-<digest>``, the
    digest of the asset's name and URI and the watcher's name (not of the options, so editing
    them keeps the stored positions)."""
    identity = json.dumps([asset.name, asset.uri, watcher_name]).encode()
    return f"triggerer-{watcher_name}-{hashlib.sha256(identity).hexdigest()[:12]}"


@dataclasses.dataclass(eq=False, repr=False, kw_only=True)
class KinesisTrigger(LaterOptionsTrigger):
    """Yield one event per record of every shard of the Kinesis stream ``stream``.

    The payload is ``{"body", "partition_key", "sequence_number", "shard_id",
    "approximate_arrival"}`` (the data decoded: JSON, else text, else ``{"base64": ...}``;
    the arrival in epoch seconds) and the dedup key ``<stream>/<shard id>/<sequence number>``.
    ``filter`` is checked on the payload, then ``apply_function`` (dotted path) may replace it
    (``None`` drops the record); ``partition_key_path`` picks the partition key from the final
    payload. A record whose processing raises is tried again in place, ``max_deliveries`` times
    in all, then becomes a dead letter (Kinesis has no dead-letter queue) and the shard goes on.

    Kinesis has no ack: each event carries its shard's position, which the daemon stores with
    it (records filtered out move it too, by a checkpoint alone at the end of their read); a
    watcher starting again reads each shard after its stored position, or on a first start
    from ``start`` (``TRIM_HORIZON``, the oldest record kept, or ``LATEST``). A shard without
    a position on a later start is read from its start, or with ``LATEST`` from the time of the
    first start, which is stored too, before the stream is looked for
    (:mod:`watchers.first_start`): a stream created after the watcher was deployed is read from
    its first record. Positions are kept under ``application_name``, by default
    derived from the watcher (:meth:`for_watcher`); ``reads_as`` shows it. Resharding is
    followed (a parent read to its end before its children), as are expired iterators and
    throttling. Credentials, region and endpoint may come from the named ``connection``.

    The trigger is shareable: every daemon on one store runs it, and they share the shards out,
    each shard read by one daemon under a lease of its own (:mod:`watchers.kinesis.sharing`),
    moved to another when its daemon stops or dies. ``lag`` stays unknown (Kinesis tells how
    far behind in time a reader is, not in records: see :attr:`millis_behind_latest`).
    """

    stream: str
    region_name: str | None = None
    endpoint_url: str | None = None
    start: str = "TRIM_HORIZON"
    application_name: str | None = None
    filter: dict[str, Any] | None = None
    apply_function: str | None = None
    partition_key_path: str | None = None
    max_deliveries: int = 5
    connection: str | None = None
    value_format: str = dataclasses.field(default="json", metadata=ADDED_LATER)
    schema_registry: str | None = dataclasses.field(default=None, metadata=ADDED_LATER)
    #: Records one GetRecords returns at most.
    limit: int = 1000
    #: How long to wait after a round of reads that found no record.
    poll_interval_s: float = 1.0
    #: How often the shards are listed again (a reshard is also followed as it is read).
    shard_sync_interval_s: float = 60.0

    #: Counters for the daemon's ``/watchers``.
    records: int = dataclasses.field(default=0, init=False)
    events: int = dataclasses.field(default=0, init=False)
    filtered: int = dataclasses.field(default=0, init=False)
    failed: int = dataclasses.field(default=0, init=False)
    dead_lettered: int = dataclasses.field(default=0, init=False)

    shareable = True

    def __post_init__(self) -> None:
        check_stream_name(self.stream, self.stream)
        if self.start not in STARTS:
            raise ValueError(f"KinesisTrigger start={self.start!r} must be one of {STARTS}")
        if self.application_name is not None and not (
            isinstance(self.application_name, str) and self.application_name
        ):
            raise ValueError(
                f"KinesisTrigger application_name={self.application_name!r} must be non-empty "
                "text; leave it out for the watcher's own"
            )
        check_range("KinesisTrigger max_deliveries", self.max_deliveries, 1, 1_000)
        check_range("KinesisTrigger limit", self.limit, 1, MAX_RECORDS_PER_READ)
        for option in ("poll_interval_s", "shard_sync_interval_s"):
            value = getattr(self, option)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"KinesisTrigger {option}={value!r} must be a positive number")
        self._processing = Processing.of_trigger(self)
        self._millis_behind: dict[str, int] = {}
        self._sharing: ShardSharing | None = None

    @property
    def application(self) -> str:
        """The name its positions are stored under."""
        return self.application_name or DEFAULT_APPLICATION

    @property
    def reads_as(self) -> str | None:
        return self.application

    def for_watcher(self, asset: WatchedAsset, watcher_name: str) -> KinesisTrigger:
        """This trigger keeping its positions under a name of the watcher's own, unless
        ``application_name`` is set."""
        if self.application_name is not None:
            return self
        return dataclasses.replace(self, application_name=watcher_application(asset, watcher_name))

    def exclusive_sources(self) -> tuple[str, ...]:
        """The stream under its application name: two different triggers there would move
        each other's positions."""
        return (f"Kinesis stream {self.stream!r} read as {self.application!r}",)

    @property
    def millis_behind_latest(self) -> int | None:
        """How far behind the newest record the slowest shard was at its last read
        (milliseconds, as Kinesis says); ``None`` before the first read."""
        return max(self._millis_behind.values(), default=None)

    def checkpoint_prefix(self) -> str:
        """What the keys of its stored positions start with (then the shard id)."""
        return f"kinesis/{self.stream}/{self.application}/"

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from watchers.kinesis.reader import KinesisClient, ShardReader

        self._processing.load()
        prefix = self.checkpoint_prefix()
        first = await first_start(prefix + STARTED)
        if first.now:
            # Taken before any iterator (a LATEST one starts after it), and before the stream
            # is looked for: a stream created later is read from this time on.
            yield first.checkpoint()
        client = KinesisClient()
        try:
            await client.connect(self.region_name, self.endpoint_url, self.connection)
            await self._check_stream(client)
            positions, _ = await stored_state(prefix)
            reader = ShardReader(
                client,
                self.stream,
                positions=positions,
                start=self.start,
                limit=self.limit,
                idle_s=self.poll_interval_s,
                relist_interval_s=self.shard_sync_interval_s,
                started_at_ms=None if first.now else first.at_ms,
            )
            self._millis_behind = reader.millis_behind
            reader.on_answer = self.polled
            self._sharing = sharing = ShardSharing(
                reader, prefix, self.stream, started_at_ms=first.at_ms
            )
            log.info(
                "kinesis_reading",
                stream=self.stream,
                reads_as=self.application,
                stored_positions=len(positions),
            )
            async for shard_id, records in reader.records():
                fence = sharing.fences.get(shard_id)
                if not records:  # read to its end: its children may be read, here or elsewhere
                    yield TriggerEvent.checkpoint_only(
                        prefix + shard_id + ENDED, ENDED_MARK, fence=fence
                    )
                    continue
                event = None
                for record in records:
                    self.records += 1
                    event = await self._event(record, shard_id, prefix + shard_id, fence)
                    if event is not None:
                        yield event
                if event is None:  # the read ends with records filtered out: past them too
                    yield TriggerEvent.checkpoint_only(
                        prefix + shard_id, records[-1]["SequenceNumber"], fence=fence
                    )
        finally:
            await client.aclose()

    async def cleanup(self) -> None:
        """Give the shards up: called once the events read are stored (on a stop, after the
        drain), so the other daemons take them at once and read on from there."""
        if self._sharing is not None:
            sharing, self._sharing = self._sharing, None
            await sharing.release()

    async def _check_stream(self, client: KinesisClient) -> None:
        """A stream that does not exist is the watcher's error, naming it and the endpoint."""
        from botocore.exceptions import ClientError

        from watchers.kinesis.reader import error_code

        try:
            await client.call("describe_stream_summary", StreamName=self.stream)
        except ClientError as error:
            if error_code(error) != "ResourceNotFoundException":
                raise
            raise SourceMissing(
                f"Kinesis stream {self.stream!r} does not exist at {client.where}; create it "
                "or fix the stream name"
            ) from error
        client.retrying = True

    async def _event(
        self, record: dict[str, Any], shard_id: str, checkpoint_key: str, fence: Fence | None
    ) -> TriggerEvent | None:
        """The event of ``record``, its dead letter, or ``None`` when it is filtered out."""
        sequence = record["SequenceNumber"]
        payload = record_payload(record, shard_id)
        arrival = payload["approximate_arrival"]
        common: dict[str, Any] = {
            "dedup_key": f"{self.stream}/{shard_id}/{sequence}",
            "sent_at": arrival,
            "checkpoint": (checkpoint_key, sequence),
            "fence": fence,
        }
        try:
            payload, cloudevent = await self._processing.decoded(payload, record.get("Data"))
        except UNREADABLE as error:
            self.dead_lettered += 1
            log.warning("kinesis_record_undecodable", shard=shard_id, sequence_number=sequence)
            return TriggerEvent.of_decoded_json(payload, dead_letter=str(error), **common)
        attempt = 0
        while True:
            attempt += 1
            try:
                prepared = self._processing.prepare(payload)
            # A user's filter or function may raise anything: that record's failure alone.
            except Exception as error:  # noqa: BLE001
                self.failed += 1
                reason = f"{type(error).__name__}: {error}"
                if attempt >= self.max_deliveries:
                    self.dead_lettered += 1
                    log.warning(
                        "kinesis_record_dead_lettered",
                        stream=self.stream,
                        shard=shard_id,
                        sequence_number=sequence,
                        error=reason,
                    )
                    return TriggerEvent.of_decoded_json(
                        payload,
                        dead_letter=f"{reason} (failed {attempt} times)",
                        **common,
                    )
                await anyio.sleep(backoff_s(attempt, 1.0))
                continue
            break
        if prepared is None:
            self.filtered += 1
            return None
        self.events += 1
        result, partition_key = prepared
        event = TriggerEvent.of_decoded_json(result, partition_key=partition_key, **common)
        return cloudevents.with_cloudevent(event, cloudevent)


# -- the Kinesis provider: kinesis:// URIs, and posting records


def _trigger_of_uri(uri: str, **options: Any) -> KinesisTrigger:
    stream, region, endpoint = parse_kinesis_uri(uri)
    for option, in_uri in (("region_name", region), ("endpoint_url", endpoint)):
        given = options.get(option)
        if in_uri and given and in_uri != given:
            raise ValueError(
                f"Kinesis URI {uri!r} says {option}={in_uri!r} but {given!r} was given"
            )
        options[option] = given or in_uri
    return KinesisTrigger(stream=stream, **options)


async def send(uri: str, bodies: Sequence[str], connection: str | None = None) -> list[str]:
    """Put each of ``bodies`` (UTF-8) as one record of the stream at ``uri``, each under a new
    random partition key (so they spread over the shards); their sequence numbers, in order.
    Records the stream throttles are put again with backoff."""
    from botocore.exceptions import ClientError, HTTPClientError
    from botocore.exceptions import ConnectionError as BotoConnectionError

    from watchers.kinesis.reader import KinesisClient, error_code

    stream, region, endpoint = parse_kinesis_uri(uri)
    client = KinesisClient()
    try:
        await client.connect(region, endpoint, connection)
        sequence_numbers: list[str] = []
        for first in range(0, len(bodies), MAX_RECORDS_PER_PUT):
            chunk = bodies[first : first + MAX_RECORDS_PER_PUT]
            try:
                sequence_numbers += await _put(client, stream, chunk)
            except ClientError as error:
                if error_code(error) == "ResourceNotFoundException":
                    raise LookupError(
                        f"Kinesis stream {stream!r} does not exist at {client.where}"
                    ) from error
                raise
            except (HTTPClientError, BotoConnectionError) as error:
                raise ConnectionError(f"Kinesis at {client.where}: {error}") from error
        return sequence_numbers
    finally:
        await client.aclose()


async def _put(client: KinesisClient, stream: str, bodies: Sequence[str]) -> list[str]:
    records = [{"Data": body.encode(), "PartitionKey": uuid.uuid4().hex} for body in bodies]
    sent: list[str | None] = [None] * len(records)
    waiting = list(range(len(records)))
    for attempt in range(1, _PUT_ATTEMPTS + 1):
        answer = await client.call(
            "put_records", StreamName=stream, Records=[records[i] for i in waiting]
        )
        failed = []
        for index, result in zip(waiting, answer["Records"], strict=True):
            if "SequenceNumber" in result:
                sent[index] = result["SequenceNumber"]
            else:
                failed.append(index)
        if not failed:
            return [number for number in sent if number is not None]
        waiting = failed
        await anyio.sleep(backoff_s(attempt, 2.0))
    raise ConnectionError(
        f"Kinesis stream {stream!r} refused {len(waiting)} of {len(records)} records "
        f"{_PUT_ATTEMPTS} times (throughput exceeded?)"
    )


PROVIDER = Provider(name="kinesis", schemes=("kinesis",), trigger=_trigger_of_uri, send=send)

# A stored trigger keeps its key: serialize() writes the classpath a store holds from before the
# package, ``watchers.kinesis.KinesisTrigger``. Set once the class is made, as the dataclass
# decorator reads the annotations in the module that defines the class.
KinesisTrigger.__module__ = "watchers.kinesis"
