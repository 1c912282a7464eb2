"""The parts the providers whose triggers share one reader of a source have in common.

The SQS poller (:mod:`watchers.sqs.session`), the Pub/Sub puller (:mod:`watchers.pubsub.puller`),
the RabbitMQ consumer (:mod:`watchers.rabbitmq.consumer`) and the Kafka fetcher
(:mod:`watchers.kafka.fetcher`) each read a source once in a daemon and hand every message to
each trigger reading it. What they share is here: the context naming the shared readers in
effect (:class:`Sharing`), the counters a reader keeps for its trigger (:class:`ReaderStats`,
shown by the trigger, a :class:`SharedReaderTrigger`), a message held until every reader is
done with it (:class:`Held`), what stops a reader (:class:`ReaderFailure`), a reader's bounded
end (:class:`BufferedReader`), a message's bytes decoded for one reader (:func:`decoded_for`),
the watchers the daemon runs on each source (:class:`ExpectedReaders`, :func:`all_joined`) and
stopping a reader's tasks (:func:`cancel_and_wait`). Each provider keeps its broker's calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import json
from collections.abc import (
    Awaitable,
    Callable,
    Collection,
    Coroutine,
    Iterable,
    Iterator,
    Mapping,
)
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from triggerer.providers import SharedReaders
from triggerer.triggers import BaseEventTrigger
from watchers.processing import LATER_DEFAULTS, UNREADABLE
from watchers.schemas.registries import RegistryError

if TYPE_CHECKING:
    from datetime import datetime

    from structlog.typing import FilteringBoundLogger

    from triggerer.cloudevents import CloudEvent
    from triggerer.triggers import TriggerEvent
    from watchers.cloudevents import Binding, Headers

SharedT = TypeVar("SharedT")
SpecT = TypeVar("SpecT")
StatsT = TypeVar("StatsT", bound="ReaderStats")
HeldT = TypeVar("HeldT")

Decode = Callable[
    [dict[str, Any], bytes | None, "Binding", "Headers", str | None],
    Awaitable[tuple[dict[str, Any], "CloudEvent | None"]],
]
"""A reader's step decoding a message's bytes into its payload and finding the CloudEvent it is
(:meth:`~watchers.processing.Processing.decoded`), given its payload, its bytes, the provider's
binding, its headers and its content type."""

#: How long a new shared reader waits for the other watchers of its source before reading,
#: so that none misses the first messages.
JOIN_WAIT_S = 5.0


class Sharing(Generic[SharedT]):
    """The shared readers in effect: within :meth:`sharing` (and the tasks started in it), a
    provider's triggers read through them; outside, each trigger has a reader of its own."""

    def __init__(self, name: str) -> None:
        self._shared: contextvars.ContextVar[SharedT | None] = contextvars.ContextVar(
            name, default=None
        )

    @contextlib.contextmanager
    def sharing(self, shared: SharedT) -> Iterator[None]:
        token = self._shared.set(shared)
        try:
            yield
        finally:
            self._shared.reset(token)

    def current(self) -> SharedT | None:
        """The shared readers in effect, ``None`` outside :meth:`sharing`."""
        return self._shared.get()


@dataclasses.dataclass(eq=False)
class ReaderStats:
    """What a shared reader did for one trigger, written by the reader and read by the trigger
    (for the daemon's ``/watchers``). A provider adds counters of its own."""

    received: int = 0
    events: int = 0
    filtered: int = 0
    failed: int = 0
    dead_lettered: int = 0
    lag: int | None = None
    last_poll_at: datetime | None = None


@dataclasses.dataclass(eq=False, kw_only=True)
class Held:
    """A message a shared reader received, held until every reader is done with it. Each
    provider adds the message's broker handle and flags of its own, and settles it with its
    broker's calls."""

    #: Events of readers holding the message, not yet acked.
    owners: int = 0
    #: Still being handed to the readers.
    dispatching: bool = True
    #: Some reader must see it again: once the others are done it goes back to the source.
    redeliver: bool = False
    #: Done with: settled with the broker, or left to it.
    settled: bool = False

    def event_handed_out(self) -> None:
        """A reader got an event of the message: it is held until that event is done."""
        self.owners += 1

    def event_done(self) -> None:
        """A reader's event of the message is done: acked, or its reader left."""
        self.owners -= 1

    @property
    def settleable(self) -> bool:
        """Every reader is done with the message, and it is not settled yet."""
        return not (self.dispatching or self.owners or self.settled)


class _Leaves(Protocol):
    async def leave(self) -> None: ...


class SharedReaderTrigger(BaseEventTrigger):
    """A trigger that reads through a shared reader: its options as given (``_kwargs``, what it
    serializes, and so the key telling it from the other readers of its source), the reader it
    joined, and its counters since it was made, read from the stats the reader writes."""

    _kwargs: dict[str, Any]
    _stats: ReaderStats
    _reader: _Leaves | None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Its options, but those added later that hold their defaults (``LATER_DEFAULTS``):
        a trigger stored before they came keeps its key."""
        return self.classpath(), {
            name: value
            for name, value in self._kwargs.items()
            if name not in LATER_DEFAULTS or value != LATER_DEFAULTS[name]
        }

    def options(self, names: Iterable[str]) -> dict[str, Any]:
        """Its options of ``names``, as given."""
        return {name: self._kwargs[name] for name in names}

    @property
    def reader_key(self) -> str:
        """Tells its reader from the other readers of the source: equal triggers share it."""
        return json.dumps(self.serialize(), sort_keys=True)

    async def cleanup(self) -> None:
        """Leave the shared reader: the messages of its events not acked yet go back to the
        source (or are held for it while the daemon runs its watcher); the last reader to leave
        closes the shared reader."""
        reader, self._reader = self._reader, None
        self._stats.lag = None
        if reader is not None:
            await reader.leave()

    @property
    def received(self) -> int:
        """Messages received (each delivery counts)."""
        return self._stats.received

    @property
    def events(self) -> int:
        """Events yielded (dead letters aside)."""
        return self._stats.events

    @property
    def filtered(self) -> int:
        """Messages dropped by ``filter`` or the trigger's function."""
        return self._stats.filtered

    @property
    def failed(self) -> int:
        """Deliveries of a message whose processing raised."""
        return self._stats.failed

    @property
    def dead_lettered(self) -> int:
        """Messages given up on: yielded as dead letters, or sent to the broker's."""
        return self._stats.dead_lettered

    @property
    def lag(self) -> int | None:
        """The source's backlog as the provider knows it; ``None`` while unknown."""
        return self._stats.lag

    @property
    def last_poll_at(self) -> datetime | None:
        """When the broker last answered, an empty answer included."""
        return self._stats.last_poll_at


@dataclasses.dataclass(frozen=True)
class ReaderFailure:
    """What stopped a shared reader, queued after a trigger's events: the trigger raises it."""

    error: BaseException


@dataclasses.dataclass(eq=False, kw_only=True)
class BufferedReader(Generic[SpecT, StatsT, HeldT]):
    """One trigger's end of a shared reader: its events, oldest first, at most ``buffer`` of
    them waiting, and what it holds of the messages of the events it has not acked yet."""

    spec: SpecT
    stats: StatsT
    buffer: int
    events: asyncio.Queue[TriggerEvent | ReaderFailure] = dataclasses.field(
        default_factory=asyncio.Queue
    )
    slots: asyncio.Semaphore = dataclasses.field(init=False)
    unacked: dict[object, HeldT] = dataclasses.field(default_factory=dict)
    #: Stopped (:meth:`fail`): its next events raise, and it is handed no more messages.
    failed: bool = dataclasses.field(default=False, init=False)

    def __post_init__(self) -> None:
        self.slots = asyncio.Semaphore(self.buffer)

    async def next_event(self) -> TriggerEvent:
        """The reader's next event; raises what stopped the shared reader."""
        item = await self.events.get()
        if isinstance(item, ReaderFailure):
            raise item.error
        self.slots.release()
        return item

    def fail(self, error: BaseException) -> None:
        """The shared reader, or this reader alone, stopped on ``error``: :meth:`next_event`
        raises it."""
        self.failed = True
        self.events.put_nowait(ReaderFailure(error))

    def free_slots(self) -> None:
        """The reader left: a loop waiting for room in its buffer goes on without it."""
        for _ in range(self.buffer):
            self.slots.release()


class _Decoding(Protocol):
    @property
    def stats(self) -> ReaderStats: ...

    @property
    def failed(self) -> bool: ...

    def fail(self, error: BaseException) -> None: ...


async def decoded_for(
    reader: _Decoding,
    decoding: Awaitable[tuple[dict[str, Any], CloudEvent | None]],
    payload: dict[str, Any],
    log: FilteringBoundLogger,
) -> tuple[dict[str, Any], CloudEvent | None, str | None] | None:
    """What ``decoding`` (the reader's :data:`Decode` of a message whose payload, as
    ``value_format="json"`` gives it, is ``payload``) gives, and ``None``; or, when the message
    is :data:`~watchers.processing.UNREADABLE` (its bytes cannot be decoded, or it is a
    malformed CloudEvent), ``payload`` as it is, no CloudEvent and the reason: a dead letter at
    once, since reading it again fails again.

    ``None`` when the schema registry does not answer (or refuses the daemon): that is no
    fault of the message, nor of the other readers, so this reader alone fails (its next event
    raises the error, and the daemon restarts its watcher with backoff) and is handed no more
    messages; the provider must not settle the message for it, so that it is read again.
    """
    try:
        decoded, cloudevent = await decoding
    except UNREADABLE as error:
        log.warning("message_undecodable", error=str(error))
        return payload, None, str(error)
    except RegistryError as error:
        reader.stats.failed += 1
        if not reader.failed:  # once, though messages decoded meanwhile fail on it too
            log.warning("schema_registry_fails_watcher", error=f"{type(error).__name__}: {error}")
            reader.fail(error)
        return None
    return decoded, cloudevent, None


class _Spec(Protocol):
    @property
    def source_key(self) -> str: ...

    @property
    def key(self) -> str: ...


class _HasSpec(Protocol):
    def reader_spec(self) -> _Spec: ...


class ReadingTasks:
    """The tasks of a shared reader: one that ends on an error fails every reader with it."""

    _readers: Mapping[str, BufferedReader[Any, Any, Any]]

    def _spawn(self, coroutine: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.create_task(coroutine, name=name)
        task.add_done_callback(self._on_task_done)
        return task

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            self._fail_readers(error)

    def _fail_readers(self, error: BaseException) -> None:
        for reader in self._readers.values():
            reader.fail(error)


def warn_options_ignored(
    log: FilteringBoundLogger, event: str, options: Iterable[str], spec: Any, first: Any, why: str
) -> None:
    """Log ``event`` when ``spec`` differs from ``first`` in ``options``: a shared reader has
    the options of its first reader, whatever later ones say."""
    differing = [name for name in options if getattr(spec, name) != getattr(first, name)]
    if differing:
        log.warning(event, options=differing, why=why)


class _Registry(Protocol):
    def keep(self, readers: Iterable[Any]) -> None: ...


RegistryT = TypeVar("RegistryT", bound=_Registry)


def shared_of_type(
    make: Callable[[], RegistryT],
    sharing: Callable[[RegistryT], AbstractContextManager[None]],
    trigger_type: type[BaseEventTrigger],
) -> Callable[[str], SharedReaders]:
    """A provider's ``shared``: in each daemon one registry of shared readers, ``make()``, read
    through within ``sharing(registry)`` and kept for the triggers of ``trigger_type``. A
    source's reader serves every deployment: the deployment plays no part."""
    return lambda deployment: _SharedOfType(make(), sharing, trigger_type)


class _SharedOfType(SharedReaders, Generic[RegistryT]):
    def __init__(
        self,
        registry: RegistryT,
        sharing: Callable[[RegistryT], AbstractContextManager[None]],
        trigger_type: type[BaseEventTrigger],
    ) -> None:
        self._registry = registry
        self._sharing = sharing
        self._trigger_type = trigger_type

    def sharing(self) -> AbstractContextManager[None]:
        return self._sharing(self._registry)

    def keep(self, triggers: Iterable[BaseEventTrigger]) -> None:
        self._registry.keep(t for t in triggers if isinstance(t, self._trigger_type))


class ExpectedReaders:
    """The readers (triggers) the daemon runs now, by source: a message is settled only once
    each of them is done with it."""

    def __init__(self) -> None:
        self._expected: dict[str, set[str]] = {}

    def keep(self, readers: Iterable[_HasSpec]) -> None:
        """The readers the daemon runs now."""
        expected: dict[str, set[str]] = {}
        for reader in readers:
            spec = reader.reader_spec()
            expected.setdefault(spec.source_key, set()).add(spec.key)
        self._expected = expected

    def of(self, source_key: str) -> Callable[[], set[str]]:
        """The keys of the readers expected on the source, as they are when called."""
        return lambda: self._expected.get(source_key, set())


async def all_joined(
    joined: asyncio.Event, missing: Callable[[], Collection[str]], *, wait_s: float = JOIN_WAIT_S
) -> None:
    """Wait (``wait_s`` at most) until no reader expected on the source is ``missing``;
    ``joined`` is set whenever one joins."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(wait_s):
            while missing():
                joined.clear()
                await joined.wait()


async def cancel_and_wait(tasks: Iterable[asyncio.Task[None]]) -> None:
    """Cancel ``tasks`` and wait for them; their own errors were already reported."""
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
