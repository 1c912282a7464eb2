"""Reading every shard of a Kinesis stream, in order, as the Kinesis API documents it.

:class:`ShardReader` lists the shards (``ListShards``, page by page), reads each open one with
``GetShardIterator`` and ``GetRecords``, and follows resharding: a closed shard is read to its
end (``NextShardIterator`` absent), then its children (``ChildShards``, or the next listing)
are read from their start, a merged child once both parents are finished. An expired iterator
(``ExpiredIteratorException``: iterators live 5 minutes) is replaced by one after the last
sequence number read; a shard whose reads are throttled (``ProvisionedThroughputExceeded``)
waits with backoff while the others go on. :class:`KinesisClient` is the API as the reader
calls it: one aiobotocore client whose transient errors (the endpoint unreachable, a server
error) are retried with backoff once the stream has been found.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

import anyio
import structlog
from botocore.exceptions import ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from triggerer.backoff import backoff_s
from triggerer.connections import get_connection

log = structlog.get_logger(__name__)

RETRY_MAX_S = 10.0
"""The longest wait between retries of a transient error or a throttled shard."""
STARTS = ("TRIM_HORIZON", "LATEST")
THROTTLED = frozenset(
    {"ProvisionedThroughputExceededException", "LimitExceededException", "ThrottlingException"}
)
_CREDENTIAL_KEYS = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")


class Calls(Protocol):
    """What the reader needs of a client: ``await calls.call("get_records", ...)``."""

    async def call(self, operation: str, **arguments: Any) -> dict[str, Any]: ...


class KinesisClient:
    """An aiobotocore Kinesis client, its credentials from a named connection."""

    def __init__(self) -> None:
        self._exit_stack = contextlib.AsyncExitStack()
        self._client: Any = None
        #: Set once the stream has been found: from then on transient errors are retried.
        self.retrying = False

    async def connect(
        self, region_name: str | None, endpoint_url: str | None, connection: str | None
    ) -> None:
        """Create the client: region and endpoint as given, else from ``connection``'s
        settings (``region_name``, ``endpoint_url``), which also hold the AWS keys."""
        from aiobotocore.config import AioConfig

        from watchers import aws

        settings = {} if connection is None else get_connection(connection)
        credentials = {key: settings[key] for key in _CREDENTIAL_KEYS if key in settings}
        # botocore retries a little itself; the reader backs off longer.
        config = AioConfig(retries={"mode": "standard", "max_attempts": 2}, read_timeout=30)
        self._client = await self._exit_stack.enter_async_context(
            aws.session().create_client(
                "kinesis",
                region_name=region_name or settings.get("region_name"),
                endpoint_url=endpoint_url or settings.get("endpoint_url"),
                config=config,
                **credentials,
            )
        )

    @property
    def where(self) -> str:
        """The endpoint and region, for messages."""
        meta = self._client.meta
        return f"{meta.endpoint_url} (region {meta.region_name})"

    async def aclose(self) -> None:
        await self._exit_stack.aclose()

    async def call(self, operation: str, **arguments: Any) -> dict[str, Any]:
        """Call the API, retrying transient errors with backoff once :attr:`retrying`."""
        attempt = 0
        while True:
            try:
                answer: dict[str, Any] = await getattr(self._client, operation)(**arguments)
            except (ClientError, HTTPClientError, BotoConnectionError) as error:
                if not (self.retrying and is_transient(error)):
                    raise
                attempt += 1
                delay_s = backoff_s(attempt, RETRY_MAX_S)
                log.warning(
                    "kinesis_call_failed",
                    operation=operation,
                    error=str(error),
                    attempt=attempt,
                    retry_in_s=round(delay_s, 2),
                )
                await anyio.sleep(delay_s)
            else:
                if attempt:
                    log.info("kinesis_call_recovered", operation=operation, attempts=attempt)
                return answer


def error_code(error: ClientError) -> str:
    code: str = error.response.get("Error", {}).get("Code", "")
    return code


def is_transient(error: Exception) -> bool:
    """An error a later call may not meet: no answer, a server error, throttling."""
    if isinstance(error, ClientError):
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return bool(status >= 500 or error_code(error) in THROTTLED)
    return True


@dataclasses.dataclass
class Shard:
    """One shard as the reader knows it."""

    shard_id: str
    parents: tuple[str, ...] = ()
    #: The last sequence number read (or stored); the next iterator starts after it.
    after: str | None = None
    #: Where an iterator starts when nothing was read yet: TRIM_HORIZON, LATEST or
    #: AT_TIMESTAMP (then at ``at_ms``, epoch milliseconds).
    start: str = "TRIM_HORIZON"
    at_ms: int | None = None
    iterator: str | None = None
    #: Read to its end (closed by a reshard, its last iterator answered).
    finished: bool = False
    throttled: int = 0
    not_before: float = 0.0


class ShardReader:
    """The records of every shard of ``stream``, a ``GetRecords`` answer at a time.

    ``positions`` are the sequence numbers read up to before, by shard id: those shards read on
    after them. ``started_at_ms`` is when the reader first started (epoch milliseconds), unknown
    (``None``) on that first start. On a first start (no positions, no ``started_at_ms``) the
    open shards start at ``start`` (with LATEST, the closed ones are skipped). Every other shard
    without a position, a child found by a reshard included, is read from its start
    (TRIM_HORIZON); with ``start`` LATEST, from ``started_at_ms`` on (AT_TIMESTAMP), so what
    came while the reader was stopped is read, and nothing from before its first start.

    Where several daemons share the stream, the reader reads only the shards it :attr:`held`
    (:meth:`share`, called by :attr:`on_round` at the start of each round of reads), and the
    shards stored as read to their end by any of them count as finished here too.
    """

    def __init__(
        self,
        calls: Calls,
        stream: str,
        *,
        positions: Mapping[str, str],
        start: str,
        limit: int,
        idle_s: float,
        relist_interval_s: float,
        started_at_ms: int | None = None,
        list_page_size: int = 1000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._calls = calls
        self._stream = stream
        self._positions = dict(positions)
        self._start = start
        self._started_at_ms = started_at_ms
        self._limit = limit
        self._idle_s = idle_s
        self._relist_interval_s = relist_interval_s
        self._list_page_size = list_page_size
        self._clock = clock
        self._relist_at = 0.0
        self.shards: dict[str, Shard] = {}
        #: By shard, how far behind the stream's tip its last answer was (milliseconds).
        self.millis_behind: dict[str, int] = {}
        #: Called at each answer of GetRecords, records or none.
        self.on_answer: Callable[[], None] = lambda: None
        #: Awaited at the start of each round of reads, once the shards are listed.
        self.on_round: Callable[[], Awaitable[None]] = _nothing
        #: The shards this reader may read (the others are other readers'); ``None``: all.
        self.held: set[str] | None = None
        # Shards stored as read to their end (by this reader or another).
        self._ended: set[str] = set()
        # Shards this reader held, then lost: read again from their stored position if held again.
        self._lost: set[str] = set()
        # Shards finished since the last of them was yielded.
        self._finished: list[str] = []
        # Whether :meth:`share` was called.
        self._shared = False

    def readable(self) -> list[Shard]:
        """The shards to read now: held, not finished, their parents (those listed) finished."""
        return [
            shard
            for shard_id, shard in sorted(self.shards.items())
            if not shard.finished
            and (self.held is None or shard_id in self.held)
            and all(
                parent not in self.shards or self.shards[parent].finished
                for parent in shard.parents
            )
        ]

    def to_share(self, ended: Collection[str]) -> list[str]:
        """The shards to be read now by one reader or another, the shards ``ended`` being
        stored as read to their end: not ended, their parents (those listed) finished here or
        ended. A shard finished here but not yet stored as ended stays among them, so that its
        reader keeps it until its last records are stored."""
        done = set(ended) | {shard_id for shard_id, shard in self.shards.items() if shard.finished}
        return [
            shard_id
            for shard_id, shard in sorted(self.shards.items())
            if shard_id not in ended
            and all(parent not in self.shards or parent in done for parent in shard.parents)
        ]

    def share(
        self,
        held: Collection[str],
        positions: Mapping[str, str],
        ended: Collection[str],
        *,
        started_at_ms: int | None = None,
    ) -> None:
        """Read only the shards ``held`` from now on; ``positions`` are the stored positions
        now, ``ended`` the shards stored as read to their end. A shard newly held reads on
        from its stored position (another reader may have moved it); one no longer held keeps
        no iterator. With ``start`` LATEST, a shard taken after the first share with no stored
        position reads from ``started_at_ms``, the first start (another reader may have read
        records of it that were never stored)."""
        self._positions.update(positions)
        self._ended = set(ended)
        before = self.held
        for shard_id, shard in self.shards.items():
            if shard_id in self._ended:
                shard.finished = True
            elif shard_id in held and (before is None or shard_id not in before):
                shard.after, shard.iterator = positions.get(shard_id), None
                if self._shared and shard.start == "LATEST" and started_at_ms is not None:
                    shard.start, shard.at_ms = "AT_TIMESTAMP", started_at_ms
                if shard_id in self._lost:  # what it read then may not have been stored
                    shard.finished = False
                elif shard.finished:  # skipped here, and its end not stored yet
                    self._finished.append(shard_id)
            elif shard_id not in held and before is not None and shard_id in before:
                self._lost.add(shard_id)
                shard.iterator = None
                self.millis_behind.pop(shard_id, None)
        self.held = set(held)
        self._shared = True

    async def records(self) -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
        """``(shard id, records)`` of each answer that has records, and ``(shard id, [])``
        when a shard is finished (read to its end or gone; or skipped, once held), until
        cancelled."""
        while True:
            if self._clock() >= self._relist_at:
                await self.list_shards()
            await self.on_round()
            while self._finished:
                yield self._finished.pop(0), []
            got_records = False
            waits = []
            for shard in self.readable():
                wait_s = shard.not_before - self._clock()
                if wait_s > 0:
                    waits.append(wait_s)
                    continue
                records = await self.read(shard)
                if records:
                    got_records = True
                    yield shard.shard_id, records
                while self._finished:
                    yield self._finished.pop(0), []
            if not got_records:
                await anyio.sleep(min([self._idle_s, *waits]))

    async def list_shards(self) -> None:
        """Learn the stream's shards (every page of ``ListShards``)."""
        listed: list[dict[str, Any]] = []
        arguments: dict[str, Any] = {"StreamName": self._stream}
        attempt = 0
        while True:
            try:
                page = await self._calls.call(
                    "list_shards", MaxResults=self._list_page_size, **arguments
                )
            except ClientError as error:
                if error_code(error) not in THROTTLED:
                    raise
                attempt += 1
                await anyio.sleep(backoff_s(attempt, RETRY_MAX_S))
                continue
            listed += page.get("Shards", [])
            token = page.get("NextToken")
            if not token:
                break
            arguments = {"NextToken": token}  # a page after the first names no stream
        first = not self.shards
        for found in listed:
            shard_id = found["ShardId"]
            if shard_id in self.shards:
                continue
            parents = tuple(
                parent
                for parent in (found.get("ParentShardId"), found.get("AdjacentParentShardId"))
                if parent
            )
            closed = "EndingSequenceNumber" in found.get("SequenceNumberRange", {})
            self._add(shard_id, parents, first=first, closed=closed)
        self._relist_at = self._clock() + self._relist_interval_s

    def _add(self, shard_id: str, parents: tuple[str, ...], *, first: bool, closed: bool) -> None:
        shard = Shard(shard_id, parents, after=self._positions.get(shard_id))
        if shard_id in self._ended:
            shard.finished = True
        elif first and not self._positions and self._started_at_ms is None:
            shard.start = self._start
            # Nothing new comes to a closed shard: reading from the latest is reading nothing.
            shard.finished = closed and self._start == "LATEST"
        elif self._start == "LATEST" and self._started_at_ms is not None:
            shard.start, shard.at_ms = "AT_TIMESTAMP", self._started_at_ms
        self.shards[shard_id] = shard
        log.debug("kinesis_shard_found", stream=self._stream, shard=shard_id, parents=parents)

    async def read(self, shard: Shard) -> list[dict[str, Any]]:
        """The records of one ``GetRecords`` of ``shard`` (none when throttled or expired)."""
        if shard.iterator is None:
            shard.iterator = await self._iterator(shard)
            if shard.iterator is None:
                return []
        try:
            answer = await self._calls.call(
                "get_records", ShardIterator=shard.iterator, Limit=self._limit
            )
        except ClientError as error:
            code = error_code(error)
            if code == "ExpiredIteratorException":
                log.info("kinesis_iterator_expired", stream=self._stream, shard=shard.shard_id)
                shard.iterator = None
                return []
            if code in THROTTLED:
                shard.throttled += 1
                wait_s = backoff_s(shard.throttled, RETRY_MAX_S)
                shard.not_before = self._clock() + wait_s
                log.warning(
                    "kinesis_shard_throttled",
                    stream=self._stream,
                    shard=shard.shard_id,
                    error=code,
                    retry_in_s=round(wait_s, 2),
                )
                return []
            raise
        self.on_answer()
        shard.throttled = 0
        records: list[dict[str, Any]] = answer.get("Records", [])
        if records:
            shard.after = records[-1]["SequenceNumber"]
        if "MillisBehindLatest" in answer:
            self.millis_behind[shard.shard_id] = answer["MillisBehindLatest"]
        shard.iterator = answer.get("NextShardIterator")
        if shard.iterator is None:
            self._finish(shard, answer.get("ChildShards", []))
        return records

    def _finish(self, shard: Shard, children: list[dict[str, Any]]) -> None:
        """``shard`` is closed and read to its end: its children may be read."""
        shard.finished = True
        self._finished.append(shard.shard_id)
        self.millis_behind.pop(shard.shard_id, None)
        for child in children:
            if child["ShardId"] not in self.shards:
                self._add(
                    child["ShardId"],
                    tuple(child.get("ParentShards", ())),
                    first=False,
                    closed=False,
                )
        log.info(
            "kinesis_shard_finished",
            stream=self._stream,
            shard=shard.shard_id,
            children=[child["ShardId"] for child in children],
        )
        # A child not named in the answer (an older API, a merge) comes with the next listing.
        self._relist_at = 0.0

    async def _iterator(self, shard: Shard) -> str | None:
        arguments: dict[str, Any] = {"StreamName": self._stream, "ShardId": shard.shard_id}
        if shard.after is not None:
            arguments |= {
                "ShardIteratorType": "AFTER_SEQUENCE_NUMBER",
                "StartingSequenceNumber": shard.after,
            }
        else:
            arguments["ShardIteratorType"] = shard.start
            if shard.at_ms is not None:
                arguments["Timestamp"] = datetime.fromtimestamp(shard.at_ms / 1000, tz=UTC)
        try:
            answer = await self._calls.call("get_shard_iterator", **arguments)
        except ClientError as error:
            if error_code(error) == "ResourceNotFoundException":
                # Gone past the stream's retention since the listing: nothing left to read.
                log.info("kinesis_shard_gone", stream=self._stream, shard=shard.shard_id)
                self._finish(shard, [])
                return None
            if error_code(error) in THROTTLED:
                shard.throttled += 1
                shard.not_before = self._clock() + backoff_s(shard.throttled, RETRY_MAX_S)
                return None
            raise
        iterator: str | None = answer.get("ShardIterator")
        return iterator


async def _nothing() -> None:
    return None
