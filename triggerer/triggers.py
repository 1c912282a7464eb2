"""Event triggers: the contract between a source of events (a queue, a folder) and the daemon."""

from __future__ import annotations

import abc
import dataclasses
import importlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from triggerer.cloudevents import CloudEvent

Ack = Callable[[], Awaitable[None]]
_STRICT_JSON = json.JSONEncoder(allow_nan=False)


def check_json(value: Any, what: str) -> None:
    """Raise ``TypeError`` naming ``what`` unless ``value`` is strict JSON, as stored in the
    metadata database: no NaN or infinities, no sets, bytes or other objects."""
    try:
        _STRICT_JSON.encode(value)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{what} must be JSON-serialisable, got {value!r}: {error}") from None


@dataclasses.dataclass(frozen=True, slots=True)
class TriggerEvent:
    """One event a trigger yields.

    ``payload`` is stored in the asset event's ``extra``; it must be JSON-serialisable.
    ``dedup_key`` makes a redelivered message produce no second event. ``ack`` is awaited only
    after the event is committed to the metadata database. ``partition_key`` routes the event
    to partitioned pipelines. ``sent_at`` is when the source took the message in (epoch
    seconds, as the broker stamped it), if it says: the daemon measures from it how long a
    message takes to become an event (``triggerer_message_to_committed_seconds``).

    ``dead_letter``, the reason, makes the message a dead letter instead of an event: the daemon
    keeps it in the dead-letter table (``triggerer events dead-letters``), under its dedup key,
    then acks it. A trigger yields one for a message it gives up on (delivered too many times,
    its processing failing each time) where the broker has no dead-letter queue of its own.

    ``checkpoint``, ``(key, position)``, is where a source without acks (a Kinesis shard) has
    been read up to: the daemon stores it in the same transaction as the event (or its dead
    letter), where :func:`triggerer.checkpoints.stored_positions` finds it when the trigger
    starts again. ``key`` names the place read (``kinesis/<stream>/<reader>/<shard>``), at most
    1,500 characters; ``position`` is a non-negative decimal integer as text, of any length
    (a Kinesis sequence number), and a stored position never moves back.

    :meth:`checkpoint_only` makes one that carries a checkpoint and nothing else
    (:attr:`is_checkpoint_only`): the daemon stores its position like any other, and it never
    becomes an event or a dead letter. A trigger yields one to move its place past messages
    that make no event (all filtered out), or to keep a place of its own (when it started).

    ``fence``, ``(lease name, tenure)``, is the lease of the part the event was read from, for a
    source whose parts several daemons share (:mod:`triggerer.part_leases`): the daemon stores
    the event, and its checkpoint, only while it still holds that lease as it did when it took
    the part; else it drops them, and the part's new holder reads them again.

    ``cloudevent``, the :class:`~triggerer.cloudevents.CloudEvent` the message is, goes into
    the event's extra as ``"cloudevent"`` (its :attr:`~triggerer.cloudevents.CloudEvent.extra`)
    beside the payload; a trigger keys such an event by ``cloudevent.dedup_key``, its
    ``source`` and ``id``, so that a copy of it that came another way is no second event.
    """

    payload: Any
    dedup_key: str | None = dataclasses.field(default=None, kw_only=True)
    ack: Ack | None = dataclasses.field(default=None, kw_only=True, repr=False, compare=False)
    partition_key: str | None = dataclasses.field(default=None, kw_only=True)
    sent_at: float | None = dataclasses.field(default=None, kw_only=True)
    dead_letter: str | None = dataclasses.field(default=None, kw_only=True)
    checkpoint: tuple[str, str] | None = dataclasses.field(default=None, kw_only=True)
    fence: tuple[str, str] | None = dataclasses.field(default=None, kw_only=True)
    cloudevent: CloudEvent | None = dataclasses.field(default=None, kw_only=True, repr=False)
    is_checkpoint_only: bool = dataclasses.field(default=False, init=False)

    def __post_init__(self) -> None:
        check_json(self.payload, "TriggerEvent payload")
        if self.checkpoint is not None:
            check_checkpoint(self.checkpoint)

    @classmethod
    def of_decoded_json(
        cls,
        payload: Any,
        *,
        dedup_key: str | None = None,
        ack: Ack | None = None,
        partition_key: str | None = None,
        sent_at: float | None = None,
        dead_letter: str | None = None,
        checkpoint: tuple[str, str] | None = None,
        fence: tuple[str, str] | None = None,
        cloudevent: CloudEvent | None = None,
    ) -> TriggerEvent:
        """An event whose payload holds only values decoded from JSON text, so is not checked.

        The check serialises the payload, which costs more than the rest of a message's path
        through a queue watcher; a payload made of decoded JSON cannot fail it.
        """
        event = object.__new__(cls)
        set_field = object.__setattr__  # the frozen dataclass's own way round its frozenness
        set_field(event, "payload", payload)
        set_field(event, "dedup_key", dedup_key)
        set_field(event, "ack", ack)
        set_field(event, "partition_key", partition_key)
        set_field(event, "sent_at", sent_at)
        set_field(event, "dead_letter", dead_letter)
        set_field(event, "checkpoint", checkpoint)
        set_field(event, "fence", fence)
        set_field(event, "cloudevent", cloudevent)
        set_field(event, "is_checkpoint_only", False)
        return event

    @classmethod
    def checkpoint_only(
        cls, key: str, position: str, *, fence: tuple[str, str] | None = None
    ) -> TriggerEvent:
        """Not an event: only the checkpoint ``(key, position)``, stored by the daemon in a
        batch's transaction as an event's would be (no payload, no ack), under ``fence``."""
        event = cls(None, checkpoint=(key, position), fence=fence)
        object.__setattr__(event, "is_checkpoint_only", True)  # not an argument of __init__
        return event


CHECKPOINT_KEY_MAX_CHARS = 1500
"""Longest key of a :attr:`TriggerEvent.checkpoint` (the store's key column)."""


def check_checkpoint(checkpoint: Any) -> None:
    """Raise ``ValueError`` unless ``checkpoint`` is ``(key, position)``: a key of 1 to
    ``CHECKPOINT_KEY_MAX_CHARS`` characters without NUL, and a position of decimal digits."""
    valid = (
        isinstance(checkpoint, tuple)
        and len(checkpoint) == 2
        and isinstance(checkpoint[0], str)
        and 0 < len(checkpoint[0]) <= CHECKPOINT_KEY_MAX_CHARS
        and "\x00" not in checkpoint[0]
        and isinstance(checkpoint[1], str)
        and checkpoint[1].isascii()
        and checkpoint[1].isdigit()
    )
    if not valid:
        raise ValueError(
            f"TriggerEvent checkpoint {checkpoint!r} must be (key, position): a key of 1 to "
            f"{CHECKPOINT_KEY_MAX_CHARS} characters and a position of decimal digits"
        )


class SourceMissing(LookupError):
    """The source a trigger reads does not exist (yet): a queue, stream, topic or subscription
    that is made after the watcher was deployed, often by its first message.

    Raised out of ``run``, it fails the watcher like any error, but the daemon tries it again
    every few seconds (at most ``SOURCE_MISSING_RETRY_MAX_S``) instead of backing off towards a
    minute, so a source created later is read within seconds. The message names the source and
    how to create it.
    """


SOURCE_MISSING_RETRY_MAX_S = 5.0
"""The longest wait of the daemon between two starts of a trigger whose source is missing."""


class WatchedAsset(Protocol):
    """The asset a watcher feeds, as a trigger sees it (a :class:`triggerer.Asset`)."""

    @property
    def name(self) -> str: ...

    @property
    def uri(self) -> str: ...


class BaseEventTrigger(abc.ABC):
    """A source of events, run by the daemon until cancelled.

    Subclasses implement ``run`` (an async generator of :class:`TriggerEvent`) and ``serialize``
    (the classpath and JSON-serialisable keyword arguments that rebuild the trigger). A trigger
    written as a dataclass gets ``serialize`` for free. Keyword arguments are stored in clear
    text: name a connection instead of passing a secret.
    """

    #: A shareable trigger runs in every daemon instance as a competing consumer (SQS, Kafka
    #: consumer groups); one that is not runs on exactly one instance, under a lease.
    shareable: bool = False

    def same_message(self, stored: Any, received: Any) -> bool:
        """Whether ``received``, a payload whose dedup key is stored already with the payload
        ``stored``, is that message delivered again (by default: the payloads are equal).

        The event is not stored again either way; when this says no, the daemon logs
        ``duplicate_key_other_message``: the source reused a key for another message (it was
        recreated and its sequence numbers restarted), so the key should tell them apart.
        Override it when a redelivery changes part of the payload (a delivery count).
        """
        return bool(stored == received)

    @classmethod
    def classpath(cls) -> str:
        return f"{cls.__module__}.{cls.__qualname__}"

    @property
    def lag(self) -> int | None:
        """Messages waiting at the source that this trigger has not handled yet; ``None`` (the
        default) when unknown. The daemon reads it at every heartbeat, so it must be cheap: keep
        a value that ``run`` updates rather than asking the source here."""
        return None

    @property
    def reads_as(self) -> str | None:
        """The name this trigger reads its source under, when the broker keeps one for it (a
        Kafka consumer group, a durable consumer, a subscription): ``watchers list`` shows it.
        ``None`` (the default) when there is none. Read at every heartbeat, like :attr:`lag`."""
        return None

    @property
    def lag_by_partition(self) -> Mapping[tuple[str, int], int]:
        """The parts of :attr:`lag` for a source of partitioned topics: ``(topic, partition)``
        to messages (``triggerer_kafka_consumer_lag``); empty (the default) when there are
        none or they are unknown. Read at every heartbeat, like :attr:`lag`."""
        return {}

    _last_poll_at: datetime | None = None

    def polled(self) -> None:
        """Say that the trigger has just asked its source for items and had an answer, whether
        any came or not (a listing, a receive, a fetch): the daemon shows it as the watcher's
        last poll, so a quiet source does not look like a stuck watcher."""
        # object's own setattr, so that a frozen dataclass trigger may call it too.
        object.__setattr__(self, "_last_poll_at", datetime.now(UTC))

    @property
    def last_poll_at(self) -> datetime | None:
        """When the trigger last asked its source (see :meth:`polled`); ``None`` (the default)
        until it has. The daemon reads it at every heartbeat; for a trigger that never says,
        the watcher's last poll is its last event. Override it when the source's client keeps
        that time itself."""
        return self._last_poll_at

    def for_watcher(self, asset: WatchedAsset, watcher_name: str) -> BaseEventTrigger:
        """The trigger the daemon runs for watcher ``watcher_name`` of ``asset``: by default
        this one.

        Override it to derive state that belongs to the watcher rather than to the options,
        such as ``KafkaTrigger``'s default consumer group. Assets that watch one identical
        trigger share one instance, made for the first of their watchers (the asset the
        daemon registered first, then the watcher name); its ``serialize()`` is what the daemon
        stores and restarts from.
        """
        return self

    def exclusive_sources(self) -> tuple[str, ...]:
        """What this trigger reads such that another reader would take its messages away (an
        SQS queue, a Kafka topic within a consumer group), each as text naming it; none (the
        default) when readers do not compete. The daemon runs one trigger per exclusive source
        and refuses a second, different one with an error naming both watchers."""
        return ()

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """The classpath and keyword arguments that rebuild this trigger with ``load_trigger``."""
        if not dataclasses.is_dataclass(self):
            raise NotImplementedError(
                f"{self.classpath()} must implement serialize() or be a dataclass"
            )
        kwargs = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
        return self.classpath(), kwargs

    @abc.abstractmethod
    def run(self) -> AsyncIterator[TriggerEvent]:
        """Yield events until cancelled."""

    async def cleanup(self) -> None:  # noqa: B027 - optional hook, a no-op unless overridden
        """Release resources; called once after ``run`` ends or is cancelled."""

    def __repr__(self) -> str:
        classpath, kwargs = self.serialize()
        return f"<{classpath} {json.dumps(kwargs, sort_keys=True)}>"


@dataclasses.dataclass(frozen=True)
class UnusableTrigger(BaseEventTrigger):
    """A trigger that could not be made, standing in for it: ``error`` says why (a queue URI
    or an option no provider accepts).

    ``MessageQueueTrigger`` returns one instead of raising, so that a bad URI is the error of
    its watcher alone: the daemon shows ``error`` as that watcher's (``triggerer watchers
    list``) and runs the rest of its file. Run on its own, it raises the error.
    """

    source: str
    error: str

    async def run(self) -> AsyncIterator[TriggerEvent]:
        raise ValueError(self.error)
        yield  # an async generator, like every trigger's run


def load_trigger(classpath: str, kwargs: dict[str, Any]) -> BaseEventTrigger:
    """Rebuild a trigger from its ``serialize()`` output."""
    module_name, _, class_name = classpath.rpartition(".")
    if not module_name:
        raise ValueError(f"trigger classpath {classpath!r} must be 'package.module.ClassName'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ImportError(f"cannot import trigger classpath {classpath!r}: {error}") from error
    cls = getattr(module, class_name, None)
    if cls is None:
        raise ImportError(f"trigger classpath {classpath!r}: {module_name} has no {class_name}")
    if not (isinstance(cls, type) and issubclass(cls, BaseEventTrigger)):
        raise ValueError(f"trigger classpath {classpath!r} is not a BaseEventTrigger subclass")
    trigger: BaseEventTrigger = cls(**kwargs)
    return trigger
