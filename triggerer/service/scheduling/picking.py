"""Which queued events the next run of a pipeline consumes: pure logic, no I/O.

A run needs the oldest event of each asset of a *choice*, a set of assets whose events satisfy
the condition: the choice satisfied earliest, or the one with the fewest assets when that one
does not fit ``max_events_per_run``. A ``coalesce`` run adds the oldest of the other queued
events, up to the cap; a ``per_event`` run is that one event per asset. A partitioned pipeline
picks among the events of one mapped partition key, the oldest key whose events allow a run.

What cannot be part of any run is reported rather than raised, so it blocks nothing else: a
partition key the pipeline's mapper cannot map, a cap smaller than the condition needs.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from sqlalchemy.exc import StatementError

from triggerer.assets import Asset, AssetAlias, AssetAll, AssetAny
from triggerer.schedules import PartitionedAssetTimetable
from triggerer.service.store.failures import is_outage
from triggerer.service.store.models import ID_LENGTH

if TYPE_CHECKING:
    from triggerer.assets import BaseAsset
    from triggerer.pipelines import RunPolicy
    from triggerer.schedules import Schedule
    from triggerer.service.scheduling.registry import Registry

Choice = frozenset[int]
"""Asset ids whose events together satisfy a condition (directly or through aliases)."""


class Picking(Protocol):
    """What picking reads of a pipeline: a :class:`~triggerer.pipelines.Pipeline`, or its
    stored definition (a replay's dry run)."""

    @property
    def schedule(self) -> Schedule | None: ...
    @property
    def run_policy(self) -> RunPolicy: ...
    @property
    def max_events_per_run(self) -> int | None: ...


@dataclasses.dataclass(frozen=True)
class Queued:
    """One queue row: an event waiting for a pipeline."""

    row_id: int
    event_id: int
    asset_id: int
    partition_key: str | None
    replayed: bool = False
    """Queued again by a replay (``events replay``), not when the event was stored."""


@dataclasses.dataclass(frozen=True)
class Pick:
    """The queue rows one run consumes (none: no run now), and why other rows must wait."""

    rows: list[Queued] = dataclasses.field(default_factory=list)
    partition_key: str | None = None
    problems: list[str] = dataclasses.field(default_factory=list)


class Unmappable(Exception):
    """A queued event whose partition key the pipeline's mapper cannot map."""


def describe(error: BaseException) -> str:
    """``Type: message`` of an error, for ``pipeline.error`` (of a database error, what the
    database said, without the statement and its parameters)."""
    message = error.orig if isinstance(error, StatementError) else error
    return f"{type(error).__name__}: {message}"


def pick_run(
    pipeline: Picking,
    condition: BaseAsset,
    rows: list[Queued],
    registry: Registry,
    alias_members: dict[int, set[AssetAlias]],
) -> Pick:
    """The rows of the next run of ``pipeline`` (scheduled on ``condition``) among its queue
    ``rows``, oldest first. Rows its current schedule cannot consume (assets it no longer
    names, plain rows of a partitioned pipeline and the reverse) are never picked."""
    candidates = {registry.asset_ids[a] for a in condition.iter_assets()} | set(alias_members)
    partitioned = isinstance(pipeline.schedule, PartitionedAssetTimetable)
    rows = [
        row
        for row in rows
        if row.asset_id in candidates and (row.partition_key is not None) == partitioned
    ]
    chooser = _Chooser(pipeline, condition, registry, alias_members)
    if isinstance(pipeline.schedule, PartitionedAssetTimetable):
        return chooser.pick_partition(pipeline.schedule, rows)
    picked, problem = chooser.pick(rows)
    return Pick(picked, None, [problem] if problem else [])


class _Chooser:
    def __init__(
        self,
        pipeline: Picking,
        condition: BaseAsset,
        registry: Registry,
        alias_members: dict[int, set[AssetAlias]],
    ) -> None:
        self._pipeline = pipeline
        self._condition = condition
        self._registry = registry
        self._alias_members = alias_members

    def pick(self, rows: list[Queued]) -> tuple[list[Queued], str | None]:
        """The rows of one run (none when the condition does not hold), or why they wait."""
        oldest: dict[int, Queued] = {}
        for row in rows:
            oldest.setdefault(row.asset_id, row)

        def earliest(choice: Choice) -> tuple[int, int]:
            return max(oldest[a].row_id for a in choice), len(choice)

        def fewest(choice: Choice) -> tuple[int, int]:
            return len(choice), max(oldest[a].row_id for a in choice)

        choice = self._choose(self._condition, oldest, earliest)
        limit = self._pipeline.max_events_per_run
        if choice is not None and limit is not None and len(choice) > limit:
            choice = self._choose(self._condition, oldest, fewest)
            if choice is not None and len(choice) > limit:
                names = ", ".join(sorted(self._name(a) for a in choice))
                return [], (
                    f"max_events_per_run={limit} is too small for {self._condition}: a run "
                    f"needs {len(choice)} events ({names}), so they stay queued"
                )
        if choice is None:
            return [], None
        required = sorted((oldest[a] for a in choice), key=lambda row: row.row_id)
        if self._pipeline.run_policy == "per_event":
            return required, None
        taken = {row.row_id for row in required}
        others = [row for row in rows if row.row_id not in taken]
        room = len(others) if limit is None else limit - len(required)
        return sorted(required + others[:room], key=lambda row: row.row_id), None

    def pick_partition(self, schedule: PartitionedAssetTimetable, rows: list[Queued]) -> Pick:
        """The rows of the oldest mapped partition key whose condition holds."""
        by_key: dict[str, list[Queued]] = defaultdict(list)
        unmappable: list[str] = []
        for row in rows:
            try:
                by_key[self._map_key(schedule, row)].append(row)
            except Unmappable as error:
                unmappable.append(str(error))
        problems: list[str] = []
        if unmappable:
            more = f" (and {len(unmappable) - 1} more)" if len(unmappable) > 1 else ""
            problems.append(
                f"{unmappable[0]}{more}; skipped: such events stay queued until the mapper "
                "accepts them or their queue rows are deleted"
            )
        for key, key_rows in by_key.items():
            picked, problem = self.pick(key_rows)
            if picked:
                return Pick(picked, key, [])
            if problem is not None and problem not in problems:
                problems.append(problem)
        return Pick([], None, problems)

    def _map_key(self, schedule: PartitionedAssetTimetable, row: Queued) -> str:
        """The mapped key of ``row``; :class:`Unmappable` says why it has none."""
        mapper = schedule.partition_key_mapper
        where = (
            f"partition key {row.partition_key!r} of event {row.event_id} "
            f"on asset {self._name(row.asset_id)!r}"
        )
        try:
            key = schedule.map_key(str(row.partition_key))
        # A mapper is user code: the one event it fails on is skipped and reported, and the
        # pipeline's other events go on.
        except Exception as error:
            if is_outage(error):
                raise
            raise Unmappable(f"{where}: {mapper!r} cannot map it: {describe(error)}") from error
        if not isinstance(key, str) or len(key) > ID_LENGTH or "\x00" in key:
            raise Unmappable(
                f"{where}: {mapper!r} mapped it to {key!r}, not a partition key "
                f"(text of at most {ID_LENGTH} characters, without NUL)"
            )
        return key

    def _choose(
        self,
        condition: BaseAsset,
        oldest: dict[int, Queued],
        rank: Callable[[Choice], tuple[int, int]],
    ) -> Choice | None:
        """Assets with queued rows that satisfy ``condition``, the least by ``rank`` at each
        OR; ``None`` when it does not hold. When no asset appears twice in the condition,
        ranking by size gives the smallest choice; otherwise a satisfying one, maybe larger."""
        if isinstance(condition, Asset):
            asset_id = self._registry.asset_ids.get(condition)
            return frozenset({asset_id}) if asset_id in oldest else None
        if isinstance(condition, AssetAlias):
            members = [
                asset_id
                for asset_id, aliases in self._alias_members.items()
                if condition in aliases and asset_id in oldest
            ]
            if not members:
                return None
            return frozenset({min(members, key=lambda asset_id: oldest[asset_id].row_id)})
        if isinstance(condition, AssetAll):
            choice: Choice = frozenset()
            for item in condition.objects:
                part = self._choose(item, oldest, rank)
                if part is None:
                    return None
                choice |= part
            return choice
        if isinstance(condition, AssetAny):
            options = [
                option
                for item in condition.objects
                if (option := self._choose(item, oldest, rank)) is not None
            ]
            return min(options, key=rank) if options else None
        raise TypeError(
            f"cannot pick events for condition {condition!r}: it is not an Asset, AssetAlias, "
            "AssetAll or AssetAny"
        )

    def _name(self, asset_id: int) -> str:
        asset = self._registry.assets.get(asset_id)
        return asset.name if asset is not None else f"#{asset_id}"
