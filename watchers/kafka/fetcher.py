"""The Kafka consumer and fetch loop KafkaTriggers read through, and their offset bookkeeping.

In the daemon, one :class:`Fetcher` per cluster and consumer settings is shared by its
KafkaTriggers (:class:`Fetchers`): each topic is fetched once and every message is handed to
each trigger reading it (fan-out). A trigger with a ``group_id`` of its own, or run on its own,
reads through a fetcher of its own in that group. A fetcher's consumer is a member of one
consumer group, so daemon instances still split partitions as competing consumers, and standard
lag tools see that group. A partition's offset is committed only up to where every trigger
reading it has acknowledged its events.

A trigger that stops (it failed and is restarted, or its options were edited) leaves its place
behind, keyed by its own ``group_id``: the commit waits for it, and the trigger that takes the
place up resumes there. :meth:`Fetchers.keep` forgets the places of watchers that are gone.

A reader is described by a :class:`ReaderSpec` (its topics, place, backpressure and consumer
settings); the fetcher never sees the trigger itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import anyio
import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from aiokafka.structs import OffsetAndMetadata

from watchers.kafka.client import (
    Listener,
    Poller,
    Record,
    connect,
    last_answer,
    raise_unless_transient,
)
from watchers.shared_readers import Sharing

if TYPE_CHECKING:
    from datetime import datetime

log = structlog.get_logger(__name__)

#: The KafkaTrigger options that a consumer shared by several triggers must have in common.
SHARED_OPTIONS = (
    "bootstrap_servers",
    "connection",
    "auto_offset_reset",
    "session_timeout_ms",
    "heartbeat_interval_ms",
    "fetch_max_wait_ms",
    "commit_interval_ms",
)
#: Most messages taken from the consumer at a time while no reader has joined.
_MAX_RECORDS = 5000
_CLOSE_TIMEOUT_S = 10.0
_SHARING: Sharing[Fetchers] = Sharing("kafka_fetchers")
#: Within ``sharing(fetchers)``, KafkaTriggers made by the daemon for a watcher
#: (``shared_fetch``) read through ``fetchers``.
sharing = _SHARING.sharing
current = _SHARING.current


def group_prefix(deployment: str) -> str:
    """The start of the shared consumer groups of a deployment (its metadata database's
    :func:`triggerer.service.store.engine.deployment_id`): instances of one deployment share their
    groups, and so split partitions; other deployments do not."""
    return f"triggerer-shared-{deployment}"


def shared_key(options: Mapping[str, Any]) -> str:
    """What identifies the shared consumer of a KafkaTrigger with these options."""
    return json.dumps({name: options[name] for name in SHARED_OPTIONS}, sort_keys=True)


def shared_group_id(prefix: str, options: Mapping[str, Any]) -> str:
    """The consumer group of the shared consumer a KafkaTrigger with ``options`` reads through."""
    return _group_id(prefix, shared_key(options))


def _group_id(prefix: str, key: str) -> str:
    return f"{prefix}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class ReaderSpec:
    """What a fetcher needs of one reader (a KafkaTrigger)."""

    topics: frozenset[str]
    #: The reader's place in the fetcher's consumer group (the trigger's ``consumer_group``):
    #: a reader that takes a place up resumes where the one before left it.
    place: str
    #: Messages handed to the reader and not yet done before the fetch pauses (backpressure).
    max_in_flight: int
    #: Which shared consumer the reader reads through: :func:`shared_key` of its options.
    shared_key: str
    #: The options of that consumer (aiokafka's), but its group and topics.
    consumer_settings: Mapping[str, Any]
    commit_interval_ms: int


class Fetchers:
    """The shared fetchers of one daemon, one per cluster and consumer settings, each in a
    consumer group named by :func:`shared_group_id`."""

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self._fetchers: dict[str, Fetcher] = {}
        self._places: set[str] | None = None

    def __iter__(self) -> Iterator[Fetcher]:
        return iter(list(self._fetchers.values()))

    async def join(self, spec: ReaderSpec) -> Reader:
        """Start reading ``spec.topics`` for its reader, where its place was left if any."""
        key = spec.shared_key
        fetcher = self._fetchers.get(key)
        if fetcher is None or fetcher.failed or fetcher.closing:
            fetcher = Fetcher.of(spec, group_id=_group_id(self._prefix, key), keeps=self.keeps)
            self._fetchers[key] = fetcher
        return await fetcher.join(spec)

    def keep(self, places: set[str]) -> None:
        """Keep only the places of these watchers (by ``group_id``): a watcher not among them
        is gone, and the commits stop waiting for it."""
        self._places = places
        for fetcher in self._fetchers.values():
            fetcher.forget_places(self.keeps)

    def keeps(self, place: str) -> bool:
        return self._places is None or place in self._places


@dataclasses.dataclass(eq=False, slots=True)
class Cursor:
    """One reader's progress on one partition in one assignment."""

    reader: Reader
    tp: TopicPartition
    #: The next offset to hand the reader; ``None`` until the partition's first message.
    next: int | None
    #: Offsets handed over and not yet done, oldest first.
    pending: deque[int] = dataclasses.field(default_factory=deque)
    done_early: set[int] = dataclasses.field(default_factory=set)
    gone: bool = False

    @property
    def safe(self) -> int | None:
        """Every offset of the partition below this one is done for the reader."""
        return self.pending[0] if self.pending else self.next

    def done(self, offset: int) -> None:
        pending = self.pending
        if not pending or pending[0] != offset:
            self.done_early.add(offset)
            return
        pending.popleft()
        while pending and pending[0] in self.done_early:
            self.done_early.remove(pending.popleft())


class Reader:
    """A trigger's end of a fetcher: the messages handed to it, oldest first."""

    def __init__(self, fetcher: Fetcher, spec: ReaderSpec) -> None:
        self.fetcher = fetcher
        self.spec = spec
        self.place = spec.place
        self.topics = spec.topics
        self.cursors: dict[TopicPartition, Cursor] = {}
        self.messages: deque[tuple[Record, Cursor]] = deque()
        self.in_flight = 0  # handed over and not yet done
        self.arrived = asyncio.Event()

    async def wait(self) -> None:
        """Until :attr:`messages` holds something; raises what stopped the fetcher."""
        while not self.messages:
            self.fetcher.raise_failure()
            self.arrived.clear()
            await self.arrived.wait()

    def hand(self, records: list[Record], cursor: Cursor) -> None:
        """Hand over ``records`` from ``cursor.next`` on (all of them while it is unknown)."""
        start = cursor.next
        messages, pending = self.messages, cursor.pending
        for record in records:
            if start is None or record.offset >= start:
                pending.append(record.offset)
                messages.append((record, cursor))
                self.in_flight += 1
        last = records[-1].offset
        if start is None or last >= start:
            cursor.next = last + 1
            self.arrived.set()

    def done(self, cursor: Cursor, offset: int) -> None:
        """The message at ``offset`` is acknowledged, filtered or dead-lettered."""
        if cursor.gone:
            return  # revoked or left: whoever reads the partition next reads it again
        cursor.done(offset)
        self.in_flight -= 1
        # Room again: a fetch loop waiting for this reader goes on.
        self.fetcher.progressed(room=self.in_flight == self.spec.max_in_flight - 1)

    def drop(self, cursors: list[Cursor]) -> None:
        """Forget ``cursors``: their messages not yet taken are dropped, their acks do nothing."""
        gone = set()
        for cursor in cursors:
            cursor.gone = True
            self.in_flight -= len(cursor.pending)
            self.cursors.pop(cursor.tp, None)
            gone.add(id(cursor))
        kept = [m for m in self.messages if id(m[1]) not in gone]
        self.messages.clear()  # in place: the trigger's loop holds this deque
        self.messages.extend(kept)

    @property
    def lag_by_partition(self) -> dict[tuple[str, int], int]:
        return self.fetcher.lag_by_partition(self)

    @property
    def last_answer(self) -> datetime | None:
        return self.fetcher.last_answer(self)


@dataclasses.dataclass(eq=False, slots=True)
class _Shared:
    """An assigned partition: where its fetch stands and who reads it."""

    tp: TopicPartition
    #: Where a reader that joins now starts: the last commit, else the first offset fetched.
    base: int | None = None
    committed: int | None = None
    #: The offset after the last one fetched.
    fetched: int | None = None
    cursors: list[Cursor] = dataclasses.field(default_factory=list)


class Fetcher:
    """One consumer, in one consumer group, reading every topic of its readers.

    ``keeps(place)`` says whether the place a stopped reader left is still waited for (by
    default every place is: a fetcher of one trigger closes when it leaves).
    """

    def __init__(
        self,
        settings: dict[str, Any],
        *,
        group_id: str,
        commit_interval_s: float,
        keeps: Callable[[str], bool] = lambda place: True,
    ) -> None:
        self.group_id = group_id
        self._settings = settings
        self._commit_interval_s = commit_interval_s
        self._keeps = keeps
        self._readers: dict[str, Reader] = {}
        #: Places left by readers that stopped: offset per partition, by place.
        self._left: dict[str, dict[TopicPartition, int]] = {}
        self._partitions: dict[TopicPartition, _Shared] = {}
        self._consumer: AIOKafkaConsumer | None = None
        self._subscribed: frozenset[str] = frozenset()
        self._task: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        #: Its last reader left: it commits and stops, and takes no new reader.
        self.closing = False
        self._changed = asyncio.Event()
        self._commit_lock = asyncio.Lock()
        self._dirty = False
        #: Messages fetched from the broker, each counted once however many readers get it.
        self.fetched = 0

    @classmethod
    def of(
        cls, spec: ReaderSpec, *, group_id: str, keeps: Callable[[str], bool] = lambda place: True
    ) -> Fetcher:
        """A fetcher in ``group_id`` with the consumer settings of ``spec``'s reader."""
        return cls(
            dict(spec.consumer_settings),
            group_id=group_id,
            commit_interval_s=spec.commit_interval_ms / 1000,
            keeps=keeps,
        )

    @property
    def failed(self) -> bool:
        return self._failure is not None

    def raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    async def join(self, spec: ReaderSpec) -> Reader:
        reader = Reader(self, spec)
        old = self._readers.pop(reader.place, None)
        if old is not None:  # an instance the daemon gave up on: its place moves to the new one
            self._leave(old)
        self._readers[reader.place] = reader
        for shared in self._partitions.values():
            if shared.tp.topic in reader.topics:
                self._add_cursor(shared, reader)
        self._left.pop(reader.place, None)  # taken up: the new cursors start there
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"kafka-fetch-{self.group_id}")
        self._changed.set()
        return reader

    async def leave(self, reader: Reader) -> None:
        """The reader stopped: keep its place; the last reader to leave stops the consumer."""
        if self._readers.get(reader.place) is not reader:
            return
        del self._readers[reader.place]
        self._leave(reader)
        self._changed.set()
        if self._readers:
            return
        self.closing = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            # What stopped a failed fetcher was raised to its readers already.
            await asyncio.gather(task, return_exceptions=True)

    def forget_places(self, keeps: Callable[[str], bool]) -> None:
        for place in [place for place in self._left if not keeps(place)]:
            del self._left[place]
            self._dirty = True

    def progressed(self, *, room: bool) -> None:
        self._dirty = True
        if room:
            self._changed.set()

    def lag_by_partition(self, reader: Reader) -> dict[tuple[str, int], int]:
        consumer = self._consumer
        if consumer is None:
            return {}
        assigned = consumer.assignment()
        lags = {}
        for tp, cursor in reader.cursors.items():
            if tp not in assigned:
                return {}  # in a rebalance: unknown until it ends
            highwater, safe = consumer.highwater(tp), cursor.safe
            if highwater is None:
                return {}
            lags[tp.topic, tp.partition] = highwater - (highwater if safe is None else safe)
        return lags

    def last_answer(self, reader: Reader) -> datetime | None:
        """When a broker last answered the consumer's fetch of the reader's partitions."""
        consumer = self._consumer
        return None if consumer is None else last_answer(consumer, reader.cursors)

    # -- readers and cursors

    def _add_cursor(self, shared: _Shared, reader: Reader) -> None:
        start = self._left.get(reader.place, {}).get(shared.tp, shared.base)
        cursor = Cursor(reader, shared.tp, start)
        shared.cursors.append(cursor)
        reader.cursors[shared.tp] = cursor
        consumer = self._consumer
        if start is not None and shared.fetched is not None and start < shared.fetched:
            if consumer is not None:
                consumer.seek(shared.tp, start)  # the others skip what they already have
            shared.fetched = start

    def _leave(self, reader: Reader) -> None:
        left = self._left.setdefault(reader.place, {}) if self._keeps(reader.place) else {}
        for cursor in list(reader.cursors.values()):
            if cursor.safe is not None:
                left[cursor.tp] = cursor.safe
            shared = self._partitions.get(cursor.tp)
            if shared is not None:
                shared.cursors.remove(cursor)
        reader.drop(list(reader.cursors.values()))
        reader.arrived.set()
        self._dirty = True

    # -- the fetch loop

    async def _run(self) -> None:
        consumer: AIOKafkaConsumer | None = None
        try:
            self._subscribed = self._topics()
            self._consumer = consumer = await connect(
                self._settings,
                group_id=self.group_id,
                topics=sorted(self._subscribed),
                listener=Listener(revoked=self._on_revoked, assigned=self._on_assigned),
            )
            poller = Poller(consumer, self.group_id, self._settings["auto_offset_reset"])
            loop = asyncio.get_running_loop()
            next_commit = loop.time()
            while True:
                self._subscribe(consumer)
                if loop.time() >= next_commit:
                    await self._commit_quietly(consumer, list(self._partitions.values()))
                    next_commit = loop.time() + self._commit_interval_s
                room = self._room()
                if room <= 0:
                    self._changed.clear()
                    with anyio.move_on_after(self._commit_interval_s):
                        await self._changed.wait()  # a reader has its fill
                    continue
                batch = await poller.poll(max_records=room)
                for tp, records in batch.items():
                    self._fan_out(tp, records)
        except asyncio.CancelledError:
            raise
        except BaseException as error:
            self._failure = error
            for reader in self._readers.values():
                reader.arrived.set()
            raise
        finally:
            if consumer is not None:
                await self._close(consumer)

    def _fan_out(self, tp: TopicPartition, records: list[Record]) -> None:
        shared = self._partitions.get(tp)
        if shared is None:
            return  # revoked meanwhile: its next owner reads it from the committed offset
        self.fetched += len(records)
        first = records[0].offset
        if shared.fetched is not None and first < shared.fetched:
            self._reset(shared, first)
        if shared.base is None:
            shared.base = first
        shared.fetched = records[-1].offset + 1
        for cursor in shared.cursors:
            cursor.reader.hand(records, cursor)

    def _reset(self, shared: _Shared, offset: int) -> None:
        """The consumer went back to ``offset`` without a reader's seek: the topic was recreated
        (the poller moved it to its start) or truncated (the client reset it).

        Each reader reads the partition afresh from there, through a new cursor: the messages it
        holds of the old offsets are still its to finish (their cursor lives on for their acks),
        and commits follow the new offsets alone.
        """
        tp = shared.tp
        log.warning(
            "kafka_partition_reset",
            group_id=self.group_id,
            partition=f"{tp.topic}/{tp.partition}",
            fetched_up_to=shared.fetched,
            restarted_at=offset,
        )
        shared.base = shared.committed = None
        shared.cursors = [Cursor(cursor.reader, tp, None) for cursor in shared.cursors]
        for cursor in shared.cursors:
            cursor.reader.cursors[tp] = cursor
        for left in self._left.values():
            left.pop(tp, None)  # an offset of the old partition: meaningless in the new one

    def _room(self) -> int:
        """How many messages every reader can still take (backpressure: the fullest reader
        holds the fetch, as a consumer of its own would hold its own)."""
        return min(
            (r.spec.max_in_flight - r.in_flight for r in self._readers.values()),
            default=_MAX_RECORDS,
        )

    def _topics(self) -> frozenset[str]:
        return frozenset().union(*(reader.topics for reader in self._readers.values()))

    def _subscribe(self, consumer: AIOKafkaConsumer) -> None:
        topics = self._topics()
        if topics and topics != self._subscribed:
            listener = Listener(revoked=self._on_revoked, assigned=self._on_assigned)
            consumer.subscribe(sorted(topics), listener=listener)
            self._subscribed = topics

    async def _close(self, consumer: AIOKafkaConsumer) -> None:
        self._dirty = True
        with anyio.move_on_after(_CLOSE_TIMEOUT_S, shield=True):
            await self._commit_quietly(consumer, list(self._partitions.values()))
        self._consumer = None
        for shared in self._partitions.values():
            for cursor in list(shared.cursors):
                cursor.reader.drop([cursor])
        self._partitions.clear()
        self._subscribed = frozenset()
        with anyio.CancelScope(shield=True):
            await consumer.stop()  # leaves the group: its partitions move to the others now
        log.info("kafka_consumer_stopped", group_id=self.group_id)

    # -- commits and rebalances

    def _commit_offset(self, shared: _Shared) -> int | None:
        """The lowest offset some reader (or a place left behind) still needs."""
        offsets = [c.safe for c in shared.cursors if c.safe is not None]
        offsets += [left[shared.tp] for left in self._left.values() if shared.tp in left]
        return min(offsets, default=None)

    async def _commit(self, consumer: AIOKafkaConsumer, partitions: list[_Shared]) -> None:
        async with self._commit_lock:  # one commit at a time, so offsets never move backwards
            if not self._dirty:
                return
            self._dirty = False
            offsets = {}
            for shared in partitions:
                offset = self._commit_offset(shared)
                if offset is not None and offset != shared.committed:
                    offsets[shared.tp] = offset
            if not offsets:
                return
            await consumer.commit({tp: OffsetAndMetadata(o, "") for tp, o in offsets.items()})
            for shared in partitions:
                if shared.tp in offsets:
                    shared.committed = shared.base = offsets[shared.tp]

    async def _commit_quietly(self, consumer: AIOKafkaConsumer, partitions: list[_Shared]) -> None:
        try:
            await self._commit(consumer, partitions)
        except (CommitFailedError, IllegalStateError) as error:
            # The group is rebalancing: the revoke listener commits what is acknowledged.
            self._dirty = True
            log.info("kafka_commit_skipped", group_id=self.group_id, error=str(error))
        except KafkaError as error:
            raise_unless_transient(error)
            self._dirty = True
            log.warning("kafka_commit_failed", group_id=self.group_id, error=str(error))

    async def _on_revoked(self, revoked: set[TopicPartition]) -> None:
        partitions = [self._partitions[tp] for tp in revoked if tp in self._partitions]
        consumer = self._consumer
        if consumer is not None and partitions:
            self._dirty = True
            try:
                await self._commit(consumer, partitions)
            except KafkaError as error:
                # The next owner reads from the last commit: a redelivery, deduplicated by key.
                log.warning("kafka_revoke_commit_failed", group_id=self.group_id, error=str(error))
        for shared in partitions:
            del self._partitions[shared.tp]
            for cursor in shared.cursors:
                cursor.reader.drop([cursor])
        for left in self._left.values():
            for tp in revoked:
                left.pop(tp, None)  # committed above; the next assignment starts there

    def _on_assigned(self, assigned: set[TopicPartition]) -> None:
        for tp in assigned:
            shared = self._partitions[tp] = _Shared(tp)
            for reader in self._readers.values():
                if tp.topic in reader.topics:
                    self._add_cursor(shared, reader)
        log.info(
            "kafka_partitions_assigned",
            group_id=self.group_id,
            partitions=sorted(f"{tp.topic}/{tp.partition}" for tp in assigned),
        )
