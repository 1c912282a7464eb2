"""The run spec: what the launcher hands a run's child process, written and read as one type.

The launcher writes it as JSON (``msgspec.json.encode``) next to the run's log; the runner (in
the child, a fork of the run forker or under spark-submit) reads it back. msgspec checks every
field on the way in, so a spec of another shape fails the run with an error naming the field.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec


class SpecAsset(msgspec.Struct, frozen=True):
    name: str
    uri: str


class SpecEvent(msgspec.Struct, frozen=True):
    """A triggering event, as the run's context shows it."""

    id: int
    asset: SpecAsset
    extra: dict[str, Any]
    timestamp: datetime
    source: str
    partition_key: str | None
    source_run_id: str | None


class SparkSpec(msgspec.Struct, frozen=True):
    """How the run reaches Spark: ``mode`` is ``connect``, ``classic`` or ``submit``."""

    mode: str
    master: str
    remote: str | None
    conf: dict[str, str]


class InletRequest(msgspec.Struct, frozen=True):
    """A run asking for the events of one of its inlets: an asset (``name`` and ``uri``, as
    :class:`SpecAsset`), or an alias (``name`` alone): the events emitted through it."""

    name: str
    uri: str | None = None


class InletAnswer(msgspec.Struct, frozen=True):
    """The daemon's answer to a run asking for an inlet's events: them, or why not."""

    events: list[SpecEvent] = []
    error: str | None = None


class RunSpec(msgspec.Struct, frozen=True):
    run_id: str
    pipeline_id: str
    fileloc: str
    application: str | None
    try_number: int
    partition_key: str | None
    params: dict[str, Any]
    triggering_events: list[SpecEvent]
    spark: SparkSpec
    inlets_socket: str | None = None
    """Where the daemon answers for the pipeline's inlet events (``daemon/inlets.py``); the run
    holds no database credential."""
    pipelines_dir: str | None = None
    """The configured pipelines folder, on the run's import path as on the daemon's when the
    file is in it (a file importing a helper module of the folder from a subfolder of it);
    None: the file's own folder."""
    trace_context: str | None = None
    """The ``traceparent`` of the run's span (``[tracing]``): the run's ``context.trace_context``
    and its ``TRACEPARENT``; None when tracing is off."""

    @classmethod
    def read(cls, path: Path) -> RunSpec:
        return msgspec.json.decode(path.read_bytes(), type=cls)
