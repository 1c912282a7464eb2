"""Reading a Redis stream as one consumer of a consumer group: the I/O a RedisStreamTrigger
reads through.

:class:`StreamGroupReader` prepares the group (the stream must exist; the group is created at
its start id when missing; consumers of daemons gone long ago are removed), then hands out
entries: those pending for ``min_idle_ms`` first (XAUTOCLAIM, with their delivery counts from
XPENDING), else new ones (XREADGROUP). It keeps the entries handed out and not yet done with
(in flight: not acknowledged, filtered or released after a failure). A task of its own resets
their idle time (XCLAIM JUSTID) every third of ``min_idle_ms``, whether or not the trigger is
reading meanwhile, so that neither a slow commit nor a consumer blocked on the daemon's
backpressure gets them claimed elsewhere; reading pauses while too many are. Acknowledgements
are gathered and sent (XACK) with the next read, in one round trip, and when the reader closes.
The group's lag is read every ``LAG_INTERVAL_S``.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import structlog

from triggerer.triggers import SourceMissing
from watchers.clients import require
from watchers.redis.address import RedisAddress, transient_errors

if TYPE_CHECKING:
    import redis.asyncio

log = structlog.get_logger(__name__)

LAG_INTERVAL_S = 1.0
#: A consumer of the group with nothing pending, idle this long, is a daemon gone: removed.
DEAD_CONSUMER_IDLE_MS = 3_600_000
_CLEANUP_TIMEOUT_S = 5.0
_LOST_IDS_LOGGED = 20

Entry = tuple[str, dict[bytes, bytes], int]
"""An entry as read: its id, its fields, and how many times the group has delivered it."""


class RedisStreamMissing(SourceMissing):
    """The stream to read does not exist (or is another type of key)."""


class Tally(Protocol):
    """What the reader counts into (the trigger's counters for the daemon's ``/watchers``)."""

    acked: int
    lost: int

    def polled(self) -> None: ...


class StreamGroupReader:
    """The entries of Redis stream ``stream`` for this process's consumer (``<host>-<pid>``)
    of consumer group ``group``, and their acknowledgements.

    One reader serves one trigger for its lifetime: :meth:`open` gives it the client of a run,
    :meth:`close` sends what is acknowledged and closes that client. Entries acknowledged are
    counted in ``tally.acked``, pending entries found trimmed away in ``tally.lost``; each
    answer to a read calls ``tally.polled()``.
    """

    def __init__(
        self,
        *,
        address: RedisAddress,
        stream: str,
        group: str,
        start_id: str,
        min_idle_ms: int,
        block_ms: int,
        batch_size: int,
        max_in_flight: int,
        tally: Tally,
    ) -> None:
        self.address = address
        self.stream = stream
        self.group = group
        self.start_id = start_id
        self.min_idle_ms = min_idle_ms
        self.block_ms = block_ms
        self.batch_size = batch_size
        self.max_in_flight = max_in_flight
        self.consumer = ""
        #: The group's entries not yet acknowledged (see ``RedisStreamTrigger.lag``).
        self.lag: int | None = None
        self._tally = tally
        self._redis: redis.asyncio.Redis | None = None
        self._acks: list[str] = []
        self._in_flight: dict[str, float] = {}
        self._room: anyio.Event | None = None
        self._refresher: asyncio.Task[None] | None = None
        self._claim_cursor = "0-0"
        self._next_claim_at = 0.0
        self._next_lag_at = 0.0
        self._last_read: tuple[int, int] | None = None

    def open(self, redis_client: redis.asyncio.Redis) -> None:
        """Read through ``redis_client`` (closed by :meth:`close`), as this process's consumer,
        and start keeping the entries in flight fresh."""
        self.consumer = f"{socket.gethostname()}-{os.getpid()}"
        self._redis = redis_client
        self._refresher = asyncio.create_task(
            self._keep_fresh(redis_client), name=f"redis-stream-refresh-{self.stream}"
        )

    async def close(self) -> None:
        """Acknowledge what is acknowledged but not yet sent, then close the client;
        idempotent. Entries handed out and not acknowledged stay pending, claimed again later."""
        redis_client, self._redis = self._redis, None
        refresher, self._refresher = self._refresher, None
        self._in_flight.clear()
        self.lag = None
        if refresher is not None:
            refresher.cancel()
            with anyio.CancelScope(shield=True):
                # An error that stopped it is next_entries()'s to raise, not the closing's.
                await asyncio.gather(refresher, return_exceptions=True)
        if redis_client is None:
            return
        try:
            with anyio.move_on_after(_CLEANUP_TIMEOUT_S, shield=True) as scope:
                try:
                    await self._flush_acks(redis_client)
                except transient_errors() as error:  # pending: claimed again and deduplicated
                    log.warning(
                        "redis_stream_final_ack_failed", stream=self.stream, error=str(error)
                    )
            if scope.cancelled_caught:
                log.warning(
                    "redis_stream_final_ack_timed_out",
                    stream=self.stream,
                    timeout_s=_CLEANUP_TIMEOUT_S,
                )
        finally:
            # Closed even when the acks timed out or failed otherwise: the client is not leaked.
            with anyio.move_on_after(_CLEANUP_TIMEOUT_S, shield=True):
                await redis_client.aclose()

    def acked(self, entry_id: str) -> None:
        """An event's ack: its entry is acknowledged with the next batch of XACK."""
        if self._in_flight.pop(entry_id, None) is not None:
            self._acks.append(entry_id)
            if self._room is not None:
                self._room.set()

    def skipped(self, entry_id: str) -> None:
        """An entry filtered out (no event): acknowledged with the next batch of XACK."""
        self._in_flight.pop(entry_id, None)
        self._acks.append(entry_id)

    def released(self, entry_id: str) -> None:
        """An entry whose processing failed: no longer kept fresh, so it stays pending until
        ``min_idle_ms`` has passed and is then claimed again (delivered once more)."""
        self._in_flight.pop(entry_id, None)

    async def server_time_ms(self) -> int:
        """The Redis server's clock (TIME), in epoch milliseconds: the clock of entry ids."""
        seconds, microseconds = await self._client().time()
        return int(seconds) * 1000 + int(microseconds) // 1000

    async def prepare(self, start_id: str | None = None) -> None:
        """Check that the stream exists, create the group unless it does (at ``start_id``, by
        default the reader's), and remove the consumers of daemons gone long ago (nothing
        pending, idle for an hour)."""
        start_id = self.start_id if start_id is None else start_id
        redis_client = self._client()
        kind = _text(await redis_client.type(self.stream))
        if kind == "none":
            raise RedisStreamMissing(
                f"Redis stream {self.stream!r} does not exist at {self.address}: create it "
                "(XADD, or XGROUP CREATE ... MKSTREAM); the watcher does not create streams"
            )
        if kind != "stream":
            raise RedisStreamMissing(
                f"Redis key {self.stream!r} at {self.address} is a {kind}, not a stream"
            )
        try:
            await redis_client.xgroup_create(self.stream, self.group, id=start_id)
        except require("redis.exceptions", "redis").ResponseError as error:
            if not str(error).startswith("BUSYGROUP"):
                raise
        else:
            log.info(
                "redis_stream_group_created",
                stream=self.stream,
                group=self.group,
                start_id=start_id,
            )
        for consumer in await redis_client.xinfo_consumers(self.stream, self.group):
            name = consumer["name"].decode()
            if consumer["pending"] == 0 and consumer["idle"] > DEAD_CONSUMER_IDLE_MS:
                await redis_client.xgroup_delconsumer(self.stream, self.group, name)
        self._claim_cursor, self._next_claim_at = "0-0", 0.0
        log.info(
            "redis_stream_reading",
            stream=self.stream,
            group=self.group,
            consumer=self.consumer,
        )

    async def next_entries(self) -> list[Entry]:
        """The next entries to handle: entries pending too long (claimed), else new ones; the
        acknowledgements gathered meanwhile are sent first."""
        redis_client = self._client()
        now = time.monotonic()
        if now >= self._next_lag_at:
            await self._read_lag(redis_client)
            self._next_lag_at = now + LAG_INTERVAL_S
        if self._refresher is not None and self._refresher.done():
            self._refresher.result()  # what stopped it (a bug): the watcher's error
        if now >= self._next_claim_at:
            await self._flush_acks(redis_client)  # an acked entry is not claimed again
            claimed = await self._claim(redis_client)
            if self._claim_cursor == "0-0":  # a pass over the pending entries is complete
                self._next_claim_at = now + self.min_idle_ms / 2000
            if claimed:
                return self._hand_out(claimed)
        if len(self._in_flight) >= self.max_in_flight:
            await self._flush_acks(redis_client)
            self._room = anyio.Event()
            with anyio.move_on_after(self.block_ms / 1000):
                await self._room.wait()
            self._room = None
            return []
        # The acks and the read in one round trip.
        ids, self._acks = self._acks, []
        try:
            async with redis_client.pipeline(transaction=False) as pipe:
                if ids:
                    pipe.xack(self.stream, self.group, *ids)
                pipe.xreadgroup(
                    self.group,
                    self.consumer,
                    {self.stream: ">"},
                    count=self.batch_size,
                    block=self.block_ms,
                )
                answers = await pipe.execute()
        except BaseException:
            self._acks = ids + self._acks  # sent again once the server answers
            raise
        self._tally.acked += len(ids)
        self._tally.polled()
        response: Any = answers[-1]
        if not response:
            return []
        [[_, entries]] = response
        return self._hand_out([(entry_id.decode(), fields, 1) for entry_id, fields in entries])

    @property
    def last_read(self) -> str | None:
        """The highest entry id this reader has handed out, ``None`` before the first: where a
        group made again under it (deleted, or its stream made again) starts."""
        if self._last_read is None:
            return None
        return "-".join(map(str, self._last_read))

    def _hand_out(self, entries: list[Entry]) -> list[Entry]:
        """``entries``, in flight from now until acknowledged, skipped or released: kept fresh
        even before their events are yielded (the trigger may wait to yield a batch's rest)."""
        now = time.monotonic()
        for entry_id, _, _ in entries:
            self._in_flight[entry_id] = now
            milliseconds, _, sequence = entry_id.partition("-")
            read = (int(milliseconds), int(sequence or 0))
            if self._last_read is None or read > self._last_read:
                self._last_read = read
        return entries

    def _client(self) -> redis.asyncio.Redis:
        if self._redis is None:
            raise RuntimeError(f"the reader of Redis stream {self.stream!r} is not open")
        return self._redis

    async def _claim(self, redis_client: redis.asyncio.Redis) -> list[Entry]:
        """One page of XAUTOCLAIM: the group's entries pending for ``min_idle_ms``, now this
        consumer's, with their delivery counts; counts and logs those trimmed away."""
        cursor, claimed, deleted = await redis_client.xautoclaim(
            self.stream,
            self.group,
            self.consumer,
            self.min_idle_ms,
            start_id=self._claim_cursor,
            count=self.batch_size,
        )
        self._claim_cursor = cursor.decode()
        if deleted:
            self._tally.lost += len(deleted)
            log.warning(
                "redis_stream_entries_lost",
                stream=self.stream,
                group=self.group,
                entries=len(deleted),
                ids=[entry_id.decode() for entry_id in deleted[:_LOST_IDS_LOGGED]],
                reason="trimmed or deleted from the stream while pending",
            )
        if not claimed:
            return []
        async with redis_client.pipeline(transaction=False) as pipe:
            for entry_id, _ in claimed:
                pipe.xpending_range(self.stream, self.group, entry_id, entry_id, 1, self.consumer)
            answers = await pipe.execute()
        delivered = {
            row["message_id"]: row["times_delivered"] for answer in answers for row in answer
        }
        log.info("redis_stream_entries_claimed", stream=self.stream, entries=len(claimed))
        return [
            (entry_id.decode(), fields, delivered.get(entry_id, 1)) for entry_id, fields in claimed
        ]

    async def _keep_fresh(self, redis_client: redis.asyncio.Redis) -> None:
        """Every third of ``min_idle_ms``, reset the idle time of the entries in flight: a task
        of its own, as the trigger may be held at a ``yield`` (the daemon's backpressure) for
        longer than that. An error is logged and the next round tries again; the reads see the
        server gone too and reconnect."""
        response_error = require("redis.exceptions", "redis").ResponseError
        retried = (*transient_errors(), response_error)
        while True:
            await anyio.sleep(self.min_idle_ms / 3000)
            try:
                await self._refresh_in_flight(redis_client)
            except retried as error:  # NOGROUP too: the reads make the group again
                log.warning(
                    "redis_stream_refresh_failed",
                    stream=self.stream,
                    group=self.group,
                    entries=len(self._in_flight),
                    error=str(error) or type(error).__name__,
                )

    async def _refresh_in_flight(self, redis_client: redis.asyncio.Redis) -> None:
        """Reset the idle time of the entries in flight for a third of ``min_idle_ms`` or more
        (XCLAIM JUSTID, which counts no delivery), so that they are not claimed elsewhere."""
        stale_before = time.monotonic() - self.min_idle_ms / 3000
        ids: list[Any] = [
            entry_id for entry_id, at in self._in_flight.items() if at <= stale_before
        ]
        for start in range(0, len(ids), 1000):
            await redis_client.xclaim(
                self.stream,
                self.group,
                self.consumer,
                0,
                ids[start : start + 1000],
                justid=True,
            )

    async def _read_lag(self, redis_client: redis.asyncio.Redis) -> None:
        for group in await redis_client.xinfo_groups(self.stream):
            if group["name"].decode() == self.group:
                lag = group.get("lag")
                self.lag = None if lag is None else lag + group["pending"]

    async def _flush_acks(self, redis_client: redis.asyncio.Redis) -> None:
        ids, self._acks = self._acks, []
        if not ids:
            return
        try:
            await redis_client.xack(self.stream, self.group, *ids)
        except BaseException:
            self._acks = ids + self._acks  # sent again once the server answers
            raise
        self._tally.acked += len(ids)


class EntryAck:
    """The ``ack`` of one entry's event: the entry goes into the reader's next XACK."""

    __slots__ = ("_entry_id", "_reader")

    def __init__(self, reader: StreamGroupReader, entry_id: str) -> None:
        self._reader = reader
        self._entry_id = entry_id

    async def __call__(self) -> None:
        self._reader.acked(self._entry_id)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
