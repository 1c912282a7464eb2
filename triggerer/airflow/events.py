"""Asset events as an Airflow task reads them (``triggering_asset_events``, ``inlet_events``):
triggerer's events with the fields Airflow's have, filled in from where the event came from."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from triggerer.assets import Asset, AssetAlias

if TYPE_CHECKING:
    from triggerer.context import AssetEvent as StoredEvent

RUN_TYPES = {
    "asset": "asset_triggered",
    "replay": "asset_triggered",
    "manual": "manual",
    "rerun": "manual",
    "cron": "scheduled",
}
"""Airflow's run type of each kind of triggerer run id (``<pipeline>__<kind>__<suffix>``)."""


@dataclasses.dataclass(frozen=True)
class SourceRun:
    """The run that emitted an event (Airflow's ``source_dag_run``): its DAG (pipeline) and
    id; a triggerer run has no logical date nor data interval."""

    dag_id: str | None
    run_id: str
    run_type: str | None
    logical_date: None = None
    data_interval_start: None = None
    data_interval_end: None = None


@dataclasses.dataclass(frozen=True)
class AssetEvent:
    """An asset event with the fields of Airflow's. Events emitted by a run name it in
    ``source_run_id``, ``source_dag_id`` and ``source_dag_run``; triggerer emits a run's
    events when the run ends, so ``source_task_id`` is ``None``."""

    id: int
    asset: Asset
    extra: dict[str, Any]
    timestamp: datetime
    source: str
    source_run_id: str | None
    source_dag_id: str | None
    source_dag_run: SourceRun | None
    partition_key: str | None = None
    source_task_id: None = None
    source_map_index: int = -1
    source_aliases: tuple[AssetAlias, ...] = ()

    @property
    def uri(self) -> str:
        return self.asset.uri

    @classmethod
    def of(cls, event: StoredEvent) -> AssetEvent:
        pipeline_id = kind = None
        if event.source_run_id is not None:
            pipeline_id, kind = run_parts(event.source_run_id)
        source_run = (
            None
            if event.source_run_id is None
            else SourceRun(pipeline_id, event.source_run_id, RUN_TYPES.get(kind or ""))
        )
        return cls(
            id=event.id,
            asset=event.asset,
            extra=event.extra,
            timestamp=event.timestamp,
            source=event.source,
            source_run_id=event.source_run_id,
            source_dag_id=pipeline_id,
            source_dag_run=source_run,
            partition_key=event.partition_key,
        )


def run_parts(run_id: str) -> tuple[str | None, str | None]:
    """The pipeline id and the kind of a run id ``<pipeline>__<kind>__<suffix>``; ``None``
    for each where the id does not say (a pipeline id too long for the column is cut)."""
    parts = run_id.rsplit("__", 2)
    if len(parts) != 3 or parts[1] not in RUN_TYPES:
        return None, None
    pipeline_id = parts[0] if "~" not in parts[0] else None
    return pipeline_id, parts[1]


def run_type(run_id: str) -> str | None:
    """Airflow's run type of a triggerer run id."""
    return RUN_TYPES.get(run_parts(run_id)[1] or "")


class TriggeringEvents(Mapping[Asset, list[AssetEvent]]):
    """``triggering_asset_events``: the events that started the run, by asset."""

    def __init__(self, events: Mapping[Asset, Sequence[StoredEvent]]) -> None:
        self._events = {asset: [AssetEvent.of(e) for e in found] for asset, found in events.items()}

    def __getitem__(self, asset: Asset) -> list[AssetEvent]:
        return self._events[asset]

    def __iter__(self) -> Iterator[Asset]:
        return iter(self._events)

    def __len__(self) -> int:
        return len(self._events)


class InletEvents(Mapping[Asset | AssetAlias, list[AssetEvent]]):
    """``inlet_events``: the stored events of each inlet asset (or alias), oldest first,
    asked of the daemon when first read."""

    def __init__(self, inlets: Mapping[Any, Sequence[StoredEvent]]) -> None:
        self._inlets = inlets
        self._read: dict[Asset | AssetAlias, list[AssetEvent]] = {}

    def __getitem__(self, key: Asset | AssetAlias) -> list[AssetEvent]:
        if key not in self._read:
            self._read[key] = [AssetEvent.of(event) for event in self._inlets[key]]
        return self._read[key]

    def __iter__(self) -> Iterator[Asset | AssetAlias]:
        return iter(self._inlets)

    def __len__(self) -> int:
        return len(self._inlets)

    def for_asset(self, name: str | None = None, *, uri: str | None = None) -> list[AssetEvent]:
        """The events of the inlet asset of that name (or URI)."""
        for key in self._inlets:
            if isinstance(key, Asset) and (name in (None, key.name)) and (uri in (None, key.uri)):
                return self[key]
        raise KeyError(f"no inlet asset has name={name!r} uri={uri!r}")

    def for_asset_alias(self, name: str) -> list[AssetEvent]:
        """The events emitted through the inlet alias ``name``."""
        return self[AssetAlias(name)]
