"""A pipeline's schedule tried on events given in advance, with the scheduler's own picking and
no store: what ``triggerer pipelines simulate`` and ``POST /pipelines/{id}/simulate`` answer.

The events are taken in time order; after each one, and at each time the picking says time
alone changes the answer (an expiry, a reset tick, a batch's or a debounce's deadline), every
run the queue allows then is started. A run is taken to end at once: ``max_active_runs`` and
pauses are the daemon's, not the schedule's, and are not simulated. Each event is queued at its
own time, so a batch's wait and a debounce count from it.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from triggerer.service.errors import Refused
from triggerer.service.scheduling.picking import Queued, pick_run
from triggerer.service.scheduling.registry import Registry

if TYPE_CHECKING:
    from collections.abc import Sequence

    from triggerer.pipelines import Pipeline


class BadSimulation(Refused):
    """An event the pipeline's schedule cannot take, or a pipeline that cannot be simulated."""


@dataclasses.dataclass(frozen=True)
class SimulatedEvent:
    """One event fed to the simulation: its asset (name or URI), time, extra, partition key."""

    asset: str
    at: datetime
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    partition_key: str | None = None

    @classmethod
    def of_json(cls, value: Any, where: str) -> SimulatedEvent:
        """The event of a JSON object ``{"asset", "at", "extra"?, "partition_key"?}``; a
        :class:`BadSimulation` naming ``where`` and the field otherwise."""
        if not isinstance(value, dict):
            raise BadSimulation(f"{where}: expected a JSON object, got {value!r}")
        unknown = value.keys() - {"asset", "at", "extra", "partition_key"}
        if unknown:
            raise BadSimulation(f"{where}: unknown field(s) {sorted(unknown)}")
        asset, at = value.get("asset"), value.get("at")
        if not isinstance(asset, str) or not asset:
            raise BadSimulation(f"{where}: 'asset' must be an asset's name or URI, got {asset!r}")
        try:
            when = datetime.fromisoformat(at) if isinstance(at, str) else None
        except ValueError:
            when = None
        if when is None:
            raise BadSimulation(f"{where}: 'at' must be an ISO time, got {at!r}")
        extra = value.get("extra", {})
        if not isinstance(extra, dict):
            raise BadSimulation(f"{where}: 'extra' must be a JSON object, got {extra!r}")
        key = value.get("partition_key")
        if key is not None and not isinstance(key, str):
            raise BadSimulation(f"{where}: 'partition_key' must be text, got {key!r}")
        return cls(asset, when if when.tzinfo else when.replace(tzinfo=UTC), extra, key)


@dataclasses.dataclass(frozen=True)
class SimulatedRun:
    at: datetime
    events: list[int]
    """The numbers (0-based, in the order given) of the events it consumes."""
    partition_key: str | None = None


@dataclasses.dataclass(frozen=True)
class Simulation:
    runs: list[SimulatedRun]
    expired: list[int]
    """Events that left the queue without a run (expired under a window, cleared at a reset)."""
    unused: list[int]
    """Events of assets the schedule does not name."""
    waiting: list[int]
    """Events still queued at the end."""


def simulate(pipeline: Pipeline, events: Sequence[SimulatedEvent]) -> Simulation:
    """The runs ``pipeline`` starts for ``events`` (see the module's docstring)."""
    condition = pipeline.condition
    if condition is None:
        raise BadSimulation(f"pipeline {pipeline.pipeline_id!r} has no asset condition to try")
    if any(True for _ in condition.iter_aliases()):
        raise BadSimulation(
            f"pipeline {pipeline.pipeline_id!r} is scheduled on an alias, whose assets only "
            "the store knows: simulate its assets' pipelines instead"
        )
    assets = list(dict.fromkeys(condition.iter_assets()))
    ids = {asset: number for number, asset in enumerate(assets, start=1)}
    registry = Registry({number: asset for asset, number in ids.items()}, ids, {}, {}, {})
    by_name = {name: asset for asset in assets for name in (asset.name, asset.uri)}
    order = sorted(range(len(events)), key=lambda number: events[number].at)
    queue: list[Queued] = []
    runs: list[SimulatedRun] = []
    expired: list[int] = []
    unused: list[int] = []

    def run_what_is_due(now: datetime) -> datetime | None:
        nonlocal queue
        while True:
            pick = pick_run(pipeline, condition, queue, registry, {}, now)
            gone = {drop.row.row_id for drop in pick.dropped} | {r.row_id for r in pick.rows}
            expired.extend(drop.row.event_id for drop in pick.dropped)
            if pick.rows:
                runs.append(
                    SimulatedRun(now, sorted(r.event_id for r in pick.rows), pick.partition_key)
                )
            queue = [row for row in queue if row.row_id not in gone]
            if not pick.rows:
                return pick.due

    def run_until(until: datetime | None, due: datetime | None) -> datetime | None:
        """Every due time up to ``until`` (to the end without one); the next due time after."""
        while due is not None and (until is None or due <= until):
            later = run_what_is_due(due)
            if later is not None and later <= due:
                raise RuntimeError(f"picking's due time {later} is not after {due}")
            due = later
        return due

    due: datetime | None = None
    for row_id, number in enumerate(order, start=1):
        event = events[number]
        due = run_until(event.at, due)
        asset = by_name.get(event.asset)
        if asset is None:
            unused.append(number)
            continue
        queue.append(Queued(row_id, number, ids[asset], event.partition_key, event.at, event.at))
        due = run_what_is_due(event.at)  # what the whole queue waits for now
    run_until(None, due)
    return Simulation(runs, sorted(expired), unused, sorted(row.event_id for row in queue))
