"""The states and kinds the tables hold: plain strings restricted by CHECK constraints (see
:mod:`triggerer.service.store.models`), their allowed values these ``StrEnum`` classes."""

from __future__ import annotations

import enum


class TriggerState(enum.StrEnum):
    """Runtime state of a trigger's watcher, as reported by the instance running it."""

    STARTING = "starting"
    RUNNING = "running"
    BACKOFF = "backoff"
    FAILED = "failed"
    STOPPED = "stopped"


class EventSource(enum.StrEnum):
    """What created an asset event."""

    TRIGGER = "trigger"
    REST_API = "rest_api"
    RUN = "run"
    CLI = "cli"
    MANUAL = "manual"


class RefRole(enum.StrEnum):
    """How a pipeline refers to an asset or alias."""

    SCHEDULE = "schedule"
    OUTLET = "outlet"
    INLET = "inlet"


class RunPolicy(enum.StrEnum):
    """How queued events are grouped into runs."""

    COALESCE = "coalesce"
    PER_EVENT = "per_event"


class RunType(enum.StrEnum):
    """Why a run was created."""

    ASSET = "asset"
    MANUAL = "manual"
    CRON = "cron"
    REST = "rest"


class RunState(enum.StrEnum):
    """Life cycle of a run."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCESS = "success"
    FAILED = "failed"
    UP_FOR_RETRY = "up_for_retry"
    CANCELLING = "cancelling"
    """Cancelled while running: the daemon running it stops its process group."""
    CANCELLED = "cancelled"


class AuditAction(enum.StrEnum):
    """A change a principal made through the API or the CLI, as the audit log names it."""

    EMIT = "emit"
    PAUSE = "pause"
    UNPAUSE = "unpause"
    TRIGGER = "trigger"
    CANCEL = "cancel"
    RERUN = "rerun"
    REPLAY = "replay"
    DELETE_QUEUED = "delete_queued"
    DB_CLEAN = "db_clean"


ACTIVE_RUN_STATES = (
    RunState.QUEUED,
    RunState.RUNNING,
    RunState.UP_FOR_RETRY,
    RunState.CANCELLING,  # its process is still being stopped
)
"""The states of the runs that count towards a pipeline's ``max_active_runs``."""
FINISHED_RUN_STATES = (RunState.SUCCESS, RunState.FAILED, RunState.CANCELLED)
"""The states of the runs that are over: they may be re-run, not cancelled."""
