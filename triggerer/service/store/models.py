"""Tables of the metadata database.

Assets and their events, triggers and their watchers, pipelines with the assets they consume and
produce, the per-consumer event queue, runs with the exact events each consumed, the audit log
of the changes principals made, and the rows that coordinate several daemon instances
(instances, leases).

Invariants the database enforces, so that no code path can break them:

- ``asset_event (asset_id, dedup_key)`` is unique: a redelivered message gives no second event
  (events without a dedup key never conflict, as SQL ``NULL`` is distinct from every value).
- ``run.run_id`` is unique: a run is never created twice.
- ``run_event (pipeline_id, event_id)`` is unique among the links the scheduler writes (a
  partial index, ``WHERE NOT rerun``): an event is consumed by at most one scheduled run of a
  pipeline, however many schedulers race for it; a re-run links the same events again.
- ``replay_event (pipeline_id, event_id)`` is a key: an event is replayed for a pipeline at most
  once, so replaying a range twice queues nothing new.
- ``source_checkpoint.key`` is a key: one stored position per place a trigger reads (a
  Kinesis shard), written with the events read up to it and never moved back.
- Foreign keys hold on SQLite too (``PRAGMA foreign_keys=ON``, see
  :mod:`triggerer.service.store.engine`).

States and kinds are plain strings restricted by CHECK constraints (no PostgreSQL enum types, so
adding a value is a one-line migration); the allowed values are the ``StrEnum`` classes of
:mod:`triggerer.service.store.states`.
Integer columns that refer to ``run.id`` are named ``*run_pk`` to keep them apart from the text
key ``run.run_id``.
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.engine.default import DefaultExecutionContext
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from triggerer.service.store.keys import asset_identity_key
from triggerer.service.store.states import (
    AuditAction,
    EventSource,
    RefRole,
    RunPolicy,
    RunState,
    RunType,
    TriggerState,
)
from triggerer.service.store.types import BigId, Json, UtcDateTime, utcnow
from triggerer.service.trace_context import TRACEPARENT_LENGTH, TRACESTATE_MAX_LENGTH

NAMING_CONVENTION: dict[str, str] = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
"""Constraint names are derived from tables and columns, so migrations can address them."""

NAME_LENGTH = 1500
"""Longest asset or alias name, URI, group and dedup key (the asset URI contract)."""

ID_LENGTH = 250
"""Longest pipeline id, run id, instance id, lease name and partition key."""


def _one_of(column: str, values: type[enum.StrEnum]) -> CheckConstraint:
    allowed = ", ".join(f"'{value}'" for value in values)
    return CheckConstraint(f"{column} IN ({allowed})", name=column)


def _default_identity_key(context: DefaultExecutionContext) -> str:
    # SQLAlchemy leaves this method unannotated; it returns the row's parameters as a dict.
    row: dict[str, Any] = context.get_current_parameters()  # type: ignore[no-untyped-call]
    return asset_identity_key(row["name"], row["uri"])


class Base(DeclarativeBase):
    """Declarative base of every table; its ``metadata`` is what migrations are compared to."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Asset(Base):
    """A data asset, identified by ``(name, uri)``; ``extra`` is not part of its identity.

    ``identity_key`` is :func:`~.keys.asset_identity_key` of ``(name, uri)``, filled in on insert;
    it carries the uniqueness of the pair (and is the conflict target of an upsert).
    """

    __tablename__ = "asset"
    __table_args__ = (Index("ix_asset_uri", "uri"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    uri: Mapped[str] = mapped_column(String(NAME_LENGTH))
    identity_key: Mapped[str] = mapped_column(
        String(64), unique=True, default=_default_identity_key
    )
    group: Mapped[str] = mapped_column(String(NAME_LENGTH), default="asset")
    extra: Mapped[dict[str, Any]] = mapped_column(Json, default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow, onupdate=utcnow)


class AssetAlias(Base):
    """A name that runs resolve to concrete assets at run time."""

    __tablename__ = "asset_alias"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LENGTH), unique=True)
    group: Mapped[str] = mapped_column(String(NAME_LENGTH), default="asset")
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)


class AssetAliasAsset(Base):
    """An asset that was added through an alias at least once."""

    __tablename__ = "asset_alias_asset"
    __table_args__ = (Index("ix_asset_alias_asset_asset_id", "asset_id"),)

    alias_id: Mapped[int] = mapped_column(
        ForeignKey("asset_alias.id", ondelete="CASCADE"), primary_key=True
    )
    asset_id: Mapped[int] = mapped_column(
        ForeignKey("asset.id", ondelete="CASCADE"), primary_key=True
    )


class Trigger(Base):
    """One trigger instance per distinct ``serialize()``, with its watcher's runtime state.

    ``key`` is :func:`~.keys.trigger_key` of ``(classpath, kwargs)``. The state columns are
    written by the instance running the watcher (``instance_id``, the last one to report); with
    several instances consuming the same queue, the latest report wins.
    """

    __tablename__ = "trigger"
    __table_args__ = (_one_of("state", TriggerState),)

    id: Mapped[int] = mapped_column(primary_key=True)
    classpath: Mapped[str] = mapped_column(String(NAME_LENGTH))
    kwargs: Mapped[dict[str, Any]] = mapped_column(Json)
    key: Mapped[str] = mapped_column(String(64), unique=True)
    state: Mapped[str] = mapped_column(String(16), default=TriggerState.STARTING.value)
    #: When the watcher last asked its source (a poll that found nothing included); for a
    #: trigger that does not say, its last event.
    last_poll_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    last_event_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    last_error: Mapped[str | None] = mapped_column(Text)
    #: When ``last_error`` happened: a watcher that has polled since has recovered from it.
    last_error_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    restart_count: Mapped[int] = mapped_column(default=0)
    lag: Mapped[int | None] = mapped_column(BigInteger)
    #: The name the running trigger reads its source under (a Kafka consumer group).
    reads_as: Mapped[str | None] = mapped_column(String(NAME_LENGTH))
    #: The pipeline whose full backlog holds the watcher back (``[runs] max_backlog``).
    held_by: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    instance_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow, onupdate=utcnow)


class AssetWatcher(Base):
    """A named watcher: events of ``trigger_id`` become events of ``asset_id``."""

    __tablename__ = "asset_watcher"
    __table_args__ = (Index("ix_asset_watcher_trigger_id", "trigger_id"),)

    asset_id: Mapped[int] = mapped_column(
        ForeignKey("asset.id", ondelete="CASCADE"), primary_key=True
    )
    name: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    trigger_id: Mapped[int] = mapped_column(ForeignKey("trigger.id", ondelete="CASCADE"))


class AssetEvent(Base):
    """An update of an asset.

    ``dedup_key`` (e.g. SQS queue + MessageId, Kafka topic/partition/offset@timestamp) is
    unique per asset: the exactly-once key of redelivered messages. The producer, when known,
    is kept in ``source_trigger_id`` or ``source_run_pk`` and set to NULL if that row is deleted.
    """

    __tablename__ = "asset_event"
    __table_args__ = (
        UniqueConstraint("asset_id", "dedup_key"),
        Index("ix_asset_event_asset_id_id", "asset_id", "id"),
        Index("ix_asset_event_source_trigger_id", "source_trigger_id"),
        Index("ix_asset_event_source_run_pk", "source_run_pk"),
        # Retention finds old events by their time; the charts count a window's per asset.
        Index("ix_asset_event_timestamp_asset_id", "timestamp", "asset_id"),
        Index("ix_asset_event_source_id", "source", "id"),  # one source's, newest first
        _one_of("source", EventSource),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    asset_id: Mapped[int] = mapped_column(ForeignKey("asset.id", ondelete="CASCADE"))
    extra: Mapped[dict[str, Any]] = mapped_column(Json, default=dict)
    source: Mapped[str] = mapped_column(String(16))
    source_trigger_id: Mapped[int | None] = mapped_column(
        ForeignKey("trigger.id", ondelete="SET NULL")
    )
    source_run_pk: Mapped[int | None] = mapped_column(
        BigId, ForeignKey("run.id", ondelete="SET NULL")
    )
    dedup_key: Mapped[str | None] = mapped_column(String(NAME_LENGTH))
    partition_key: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    timestamp: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)
    # The W3C trace context the event carries (docs/tracing.md): its message's, its REST
    # request's, or the run's that emitted it. Checked before it is stored.
    traceparent: Mapped[str | None] = mapped_column(String(TRACEPARENT_LENGTH))
    tracestate: Mapped[str | None] = mapped_column(String(TRACESTATE_MAX_LENGTH))


class DeadLetter(Base):
    """An event the store could not hold (a payload or key the database rejects), kept with
    the reason so its message can be acked instead of holding back every event after it.

    ``payload`` is the event's extra as text; ``(asset_id, dedup_key)`` is unique, so a
    redelivered poison message is one dead letter.
    """

    __tablename__ = "dead_letter"
    __table_args__ = (
        UniqueConstraint("asset_id", "dedup_key"),
        Index("ix_dead_letter_created_at", "created_at"),  # retention's
        _one_of("source", EventSource),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    asset_id: Mapped[int | None] = mapped_column(ForeignKey("asset.id", ondelete="SET NULL"))
    trigger_id: Mapped[int | None] = mapped_column(ForeignKey("trigger.id", ondelete="SET NULL"))
    source: Mapped[str] = mapped_column(String(16))
    dedup_key: Mapped[str | None] = mapped_column(String(NAME_LENGTH))
    partition_key: Mapped[str | None] = mapped_column(Text)
    payload: Mapped[str] = mapped_column(Text)
    reason: Mapped[str] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)


class SourceCheckpoint(Base):
    """How far a trigger of a source without acks has read one place of it (a Kinesis shard,
    under the name its watcher reads as): written in the transaction of the events read up to
    it (:attr:`triggerer.triggers.TriggerEvent.checkpoint`), and read by the trigger when it
    starts (:mod:`triggerer.checkpoints`).

    ``position`` is a non-negative decimal integer as text, of any length (Kinesis sequence
    numbers have up to 129 digits); an update that would move it back is not made. No foreign
    key: the place outlives the trigger row, so a watcher edited or re-added reads on.
    """

    __tablename__ = "source_checkpoint"

    key: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    position: Mapped[str] = mapped_column(Text)
    updated_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)


class AssetEventAlias(Base):
    """An event emitted through an alias (one event may come through several)."""

    __tablename__ = "asset_event_alias"
    __table_args__ = (Index("ix_asset_event_alias_alias_id", "alias_id"),)

    event_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("asset_event.id", ondelete="CASCADE"), primary_key=True
    )
    alias_id: Mapped[int] = mapped_column(
        ForeignKey("asset_alias.id", ondelete="CASCADE"), primary_key=True
    )


class Pipeline(Base):
    """A pipeline found in the pipelines folder.

    ``schedule`` is a JSON description of the schedule (what the scheduler evaluates) and
    ``schedule_text`` its human-readable form. ``partitioned`` pipelines consume only events
    with a partition key, the others only events without one. ``is_active`` turns false when
    the file defining the pipeline is gone; the row and its history are kept. ``next_cron_at``
    is the next tick of a cron-based schedule, NULL otherwise. ``error`` (since ``error_at``)
    says why evaluating the pipeline fails, NULL while it works.
    """

    __tablename__ = "pipeline"
    __table_args__ = (_one_of("run_policy", RunPolicy),)

    pipeline_id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    fileloc: Mapped[str] = mapped_column(Text)
    schedule: Mapped[dict[str, Any]] = mapped_column(Json)
    schedule_text: Mapped[str] = mapped_column(Text)
    paused: Mapped[bool] = mapped_column(default=False)
    is_active: Mapped[bool] = mapped_column(default=True)
    partitioned: Mapped[bool] = mapped_column(default=False)
    max_active_runs: Mapped[int] = mapped_column(default=16)
    run_policy: Mapped[str] = mapped_column(String(16), default=RunPolicy.COALESCE.value)
    max_events_per_run: Mapped[int | None] = mapped_column()
    retries: Mapped[int] = mapped_column(default=0)
    next_cron_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime, index=True)
    error: Mapped[str | None] = mapped_column(Text)
    error_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow, onupdate=utcnow)


class PipelineImportError(Base):
    """A file of the pipelines folder that failed to load (or a folder that cannot be read),
    as of the last load of the folder: one row per file, gone once it loads again.

    ``key`` is :func:`~.keys.import_error_key` of ``fileloc`` (a path may be longer than a
    unique index holds). ``line`` is the line in the file where it failed, when known; ``traceback``
    the last frames of the traceback. ``error_at`` is when this error (message and line) was
    first reported; ``updated_at`` when a load last reported it.
    """

    __tablename__ = "import_error"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    fileloc: Mapped[str] = mapped_column(Text)
    line: Mapped[int | None] = mapped_column()
    error: Mapped[str] = mapped_column(Text)
    traceback: Mapped[str | None] = mapped_column(Text)
    error_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow, onupdate=utcnow)


class PipelineAssetRef(Base):
    """A pipeline's use of an asset: scheduled on it, producing it, or reading it."""

    __tablename__ = "pipeline_asset_ref"
    __table_args__ = (
        Index("ix_pipeline_asset_ref_asset_id_role", "asset_id", "role"),
        _one_of("role", RefRole),
    )

    pipeline_id: Mapped[str] = mapped_column(
        ForeignKey("pipeline.pipeline_id", ondelete="CASCADE"), primary_key=True
    )
    asset_id: Mapped[int] = mapped_column(
        ForeignKey("asset.id", ondelete="CASCADE"), primary_key=True
    )
    role: Mapped[str] = mapped_column(String(16), primary_key=True)


class PipelineAliasRef(Base):
    """A pipeline's use of an asset alias: scheduled on it, producing or reading through it."""

    __tablename__ = "pipeline_alias_ref"
    __table_args__ = (
        Index("ix_pipeline_alias_ref_alias_id_role", "alias_id", "role"),
        _one_of("role", RefRole),
    )

    pipeline_id: Mapped[str] = mapped_column(
        ForeignKey("pipeline.pipeline_id", ondelete="CASCADE"), primary_key=True
    )
    alias_id: Mapped[int] = mapped_column(
        ForeignKey("asset_alias.id", ondelete="CASCADE"), primary_key=True
    )
    role: Mapped[str] = mapped_column(String(16), primary_key=True)


class QueuedEvent(Base):
    """An event waiting to be consumed by one consuming pipeline.

    ``asset_id`` repeats the event's asset so conditions are evaluated from this table alone;
    it has no foreign key of its own: deleting an asset deletes its events, and their queue
    rows through ``event_id``. ``partition_key`` is the event's key after the pipeline's
    partition mapper. ``replay_id`` is the :class:`Replay` that queued the event again (NULL
    for the rows of new events); it has no foreign key either (adding one would have rebuilt
    this table on SQLite), and replays are not deleted while their pipeline exists.
    """

    __tablename__ = "queued_event"
    __table_args__ = (
        UniqueConstraint("pipeline_id", "event_id"),
        Index("ix_queued_event_pipeline_id_id", "pipeline_id", "id"),
        # The scheduler's "has this asset a queued event for this pipeline" probe.
        Index("ix_queued_event_pipeline_id_asset_id_id", "pipeline_id", "asset_id", "id"),
        Index("ix_queued_event_event_id", "event_id"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    pipeline_id: Mapped[str] = mapped_column(ForeignKey("pipeline.pipeline_id", ondelete="CASCADE"))
    asset_id: Mapped[int]
    event_id: Mapped[int] = mapped_column(BigId, ForeignKey("asset_event.id", ondelete="CASCADE"))
    partition_key: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)
    replay_id: Mapped[int | None] = mapped_column()


class Replay(Base):
    """A replay of the stored events of ``asset_id`` whose time is in ``[since, until)``, for
    one pipeline that consumes the asset, asked at ``created_at``."""

    __tablename__ = "replay"
    __table_args__ = (
        Index("ix_replay_asset_id", "asset_id"),
        Index("ix_replay_pipeline_id", "pipeline_id"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    asset_id: Mapped[int] = mapped_column(ForeignKey("asset.id", ondelete="CASCADE"))
    pipeline_id: Mapped[str] = mapped_column(ForeignKey("pipeline.pipeline_id", ondelete="CASCADE"))
    since: Mapped[dt.datetime] = mapped_column(UtcDateTime)
    until: Mapped[dt.datetime] = mapped_column(UtcDateTime)
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)


class ReplayEvent(Base):
    """An event a replay covered for a pipeline (queued it again, or found it queued still).

    The key ``(pipeline_id, event_id)`` makes replays idempotent: each stored event is replayed
    for a pipeline at most once, however often and however concurrently replays are asked.
    """

    __tablename__ = "replay_event"
    __table_args__ = (
        Index("ix_replay_event_event_id", "event_id"),
        Index("ix_replay_event_replay_id", "replay_id"),
    )

    pipeline_id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    event_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("asset_event.id", ondelete="CASCADE"), primary_key=True
    )
    replay_id: Mapped[int] = mapped_column(ForeignKey("replay.id", ondelete="CASCADE"))


class Run(Base):
    """A run of a pipeline.

    ``run_id`` is the unique run key. ``logical_date`` is NULL for asset-triggered runs.
    ``try_number`` counts started attempts, up to ``max_tries``. ``owner`` is the id of the
    instance executing the run and ``heartbeat_at`` its last sign of life. ``rerun_of`` is the
    ``run_id`` of the run this one runs again: text without a foreign key, so it still names
    that run once retention has deleted it.
    """

    __tablename__ = "run"
    __table_args__ = (
        # Lets run_event name (run, pipeline) in one foreign key, so its pipeline_id is the run's.
        UniqueConstraint("id", "pipeline_id"),
        Index("ix_run_pipeline_id_state", "pipeline_id", "state"),
        Index("ix_run_pipeline_id_id", "pipeline_id", "id"),  # a pipeline's, newest first
        Index("ix_run_state", "state"),
        Index("ix_run_end_date", "end_date"),  # retention finds old runs by their end
        Index("ix_run_created_at", "created_at"),  # the API's runs since a time
        _one_of("run_type", RunType),
        _one_of("state", RunState),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(ID_LENGTH), unique=True)
    pipeline_id: Mapped[str] = mapped_column(ForeignKey("pipeline.pipeline_id", ondelete="CASCADE"))
    run_type: Mapped[str] = mapped_column(String(16))
    logical_date: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    partition_key: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    state: Mapped[str] = mapped_column(String(16), default=RunState.QUEUED.value)
    try_number: Mapped[int] = mapped_column(default=0)
    max_tries: Mapped[int] = mapped_column(default=1)
    params: Mapped[dict[str, Any]] = mapped_column(Json, default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)
    start_date: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    end_date: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    next_try_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    heartbeat_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    owner: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    log_path: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
    rerun_of: Mapped[str | None] = mapped_column(String(ID_LENGTH))


class RunEvent(Base):
    """An event consumed by a run. The scheduler's links (``rerun`` false) are unique per
    ``(pipeline_id, event_id)``; a re-run's links repeat those of the run it runs again, and
    the links of events a replay queued again are marked ``rerun`` too (the replay's own key
    makes those unique)."""

    __tablename__ = "run_event"
    __table_args__ = (
        ForeignKeyConstraint(
            ["run_pk", "pipeline_id"], ["run.id", "run.pipeline_id"], ondelete="CASCADE"
        ),
        Index(
            "uq_run_event_pipeline_id_event_id",
            "pipeline_id",
            "event_id",
            unique=True,
            sqlite_where=text("NOT rerun"),
            postgresql_where=text("NOT rerun"),
        ),
        Index("ix_run_event_event_id", "event_id"),
    )

    run_pk: Mapped[int] = mapped_column(BigId, primary_key=True)
    event_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("asset_event.id", ondelete="CASCADE"), primary_key=True
    )
    pipeline_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    rerun: Mapped[bool] = mapped_column(default=False, server_default=false())


class RunLogChunk(Base):
    """A piece of a run's log, shipped into the store by the daemon running it while it runs
    (:mod:`triggerer.service.runs.log_shipping`), so that every daemon's API and the CLI read
    it, and it outlives that daemon and its logs folder.

    ``position`` is where ``data`` (the log's bytes, as the run wrote them) starts in the log of
    try ``try_number``: a gap between two chunks is what the size cap (``[runs]
    log_max_bytes``) cut. A try that printed nothing has one empty chunk. The store keeps the
    latest try's chunks; they go with their run.
    """

    __tablename__ = "run_log_chunk"

    run_pk: Mapped[int] = mapped_column(
        BigId, ForeignKey("run.id", ondelete="CASCADE"), primary_key=True
    )
    try_number: Mapped[int] = mapped_column(primary_key=True)
    seq: Mapped[int] = mapped_column(primary_key=True)
    position: Mapped[int] = mapped_column(BigInteger)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)


class WatcherLagSample(Base):
    """A watcher's lag (messages behind its source) as its instance saw it at a heartbeat, at
    most one a minute per trigger and kept for a day (:mod:`triggerer.service.daemon.lag_samples`):
    what the UI draws as lag over time."""

    __tablename__ = "watcher_lag_sample"
    __table_args__ = (
        Index("ix_watcher_lag_sample_sampled_at", "sampled_at"),  # the window's and retention's
        Index("ix_watcher_lag_sample_trigger_id_sampled_at", "trigger_id", "sampled_at"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    trigger_id: Mapped[int] = mapped_column(ForeignKey("trigger.id", ondelete="CASCADE"))
    sampled_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)
    lag: Mapped[int] = mapped_column(BigInteger)


class Instance(Base):
    """A running daemon process; ``heartbeat_at`` is what ``triggerer check`` reads."""

    __tablename__ = "instance"

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    hostname: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column()
    started_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)
    heartbeat_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)


class Notice(Base):
    """A notice for the daemons sharing a SQLite store, which has no NOTIFY (see
    :mod:`~triggerer.service.store.notices`): written in the transaction of the change it tells
    of, read by id order, and deleted after a minute. ``AUTOINCREMENT``: an id is never used
    twice, so "the notices after the last one read" misses none."""

    __tablename__ = "notice"
    __table_args__ = ({"sqlite_autoincrement": True},)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    payload: Mapped[str] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)


class AuditEntry(Base):
    """A change a principal made through the API or the CLI (:mod:`triggerer.service.audit`),
    written in the transaction of the change: who (``actor``, the principal's name), what
    (``action``), on what (``target``: ``pipeline:<id>``, ``run:<run_id>``, ``asset:<uri>``,
    ``database``) and with which values (``details``: the request's, and what it did)."""

    __tablename__ = "audit"
    __table_args__ = (
        Index("ix_audit_time", "time"),  # since a time, and retention's
        Index("ix_audit_target_id", "target", "id"),  # a pipeline's last changes, newest first
        Index("ix_audit_actor_id", "actor", "id"),
        Index("ix_audit_action_id", "action", "id"),
        _one_of("action", AuditAction),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    time: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)
    actor: Mapped[str] = mapped_column(String(ID_LENGTH))
    action: Mapped[str] = mapped_column(String(16))
    target: Mapped[str] = mapped_column(Text)
    details: Mapped[dict[str, Any]] = mapped_column(Json, default=dict)


class Lease(Base):
    """A named lease held by one instance until ``expires_at`` unless renewed.

    Used for triggers that cannot be shared and for singleton jobs; on PostgreSQL it is claimed
    with ``SELECT ... FOR UPDATE SKIP LOCKED``.
    """

    __tablename__ = "lease"

    name: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    owner: Mapped[str] = mapped_column(String(ID_LENGTH))
    acquired_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)
    expires_at: Mapped[dt.datetime] = mapped_column(UtcDateTime)
