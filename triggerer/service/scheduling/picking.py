"""Which queued events the next run of a pipeline consumes, and when: pure logic, no I/O.

A run needs one event of each asset of a *choice*, a set of assets whose events satisfy the
condition: the choice satisfied earliest, or the one with the fewest assets when that one does
not fit ``max_events_per_run``. Each asset gives its oldest event, except under an AND with a
window (``within``): there the events must lie within the window of each other, and the
earliest such set is taken. A ``coalesce`` run adds the oldest of the other queued events, up to
the cap; a ``per_event`` run is that one event per asset. A partitioned pipeline picks among the
events of one mapped partition key, the oldest key whose events allow a run.

Time enters through ``now``, given by the caller (the scheduler's clock, or a simulation's):

- an event of an asset that the condition names only under windows leaves the queue
  (*expires*) the longest of those windows after its own timestamp;
- an AND with a ``reset`` clears its assets' events queued before its last cron tick;
- a ``batch`` holds a run until ``max_events`` are queued or the oldest has waited
  ``max_wait_s``; ``debounce_s`` holds it until no event has been queued for that long.

The pick says when to look again (:attr:`Pick.due`): the next expiry, reset tick or deadline.
What cannot be part of any run is reported rather than raised, so it blocks nothing else: a
partition key the pipeline's mapper cannot map, a cap smaller than the condition needs.
"""

from __future__ import annotations

import dataclasses
import zoneinfo
from collections import defaultdict
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Literal, Protocol

from croniter import croniter
from sqlalchemy.exc import StatementError

from triggerer.assets import Asset, AssetAlias, AssetAll, AssetAny, lifetimes
from triggerer.crons import next_tick
from triggerer.schedules import PartitionedAssetTimetable
from triggerer.service.store.failures import is_outage
from triggerer.service.store.models import ID_LENGTH

if TYPE_CHECKING:
    from triggerer.assets import BaseAsset
    from triggerer.pipelines import RunPolicy
    from triggerer.schedules import Batch, Schedule
    from triggerer.service.scheduling.registry import Registry


class Picking(Protocol):
    """What picking reads of a pipeline: a :class:`~triggerer.pipelines.Pipeline`, or its
    stored definition (a replay's dry run)."""

    @property
    def schedule(self) -> Schedule | None: ...
    @property
    def run_policy(self) -> RunPolicy: ...
    @property
    def max_events_per_run(self) -> int | None: ...
    @property
    def batch(self) -> Batch | None: ...
    @property
    def debounce_s(self) -> float | None: ...


@dataclasses.dataclass(frozen=True)
class Queued:
    """One queue row: an event waiting for a pipeline."""

    row_id: int
    event_id: int
    asset_id: int
    partition_key: str | None
    at: datetime
    """The event's timestamp: windows are counted from it."""
    queued_at: datetime
    """When the row was queued: resets, batches and debounce are counted from it."""
    replayed: bool = False
    """Queued again by a replay (``events replay``), not when the event was stored."""


Choice = frozenset[Queued]
"""Queue rows, one per asset, whose events together satisfy a condition."""


@dataclasses.dataclass(frozen=True)
class Dropped:
    """A queue row that left the queue without a run, and why."""

    row: Queued
    reason: Literal["expired", "reset"]
    at: datetime
    """When it expired, or the reset tick that cleared it."""


@dataclasses.dataclass(frozen=True)
class Pick:
    """The queue rows one run consumes (none: no run now), the rows that leave the queue
    without a run, why other rows must wait, and when to look again."""

    rows: list[Queued] = dataclasses.field(default_factory=list)
    partition_key: str | None = None
    problems: list[str] = dataclasses.field(default_factory=list)
    dropped: list[Dropped] = dataclasses.field(default_factory=list)
    due: datetime | None = None
    """When time alone may change the answer: an expiry, a reset tick, a batch's or a
    debounce's deadline (``None``: only new events can)."""


class Unmappable(Exception):
    """A queued event whose partition key the pipeline's mapper cannot map."""


def describe(error: BaseException) -> str:
    """``Type: message`` of an error, for ``pipeline.error`` (of a database error, what the
    database said, without the statement and its parameters)."""
    message = error.orig if isinstance(error, StatementError) else error
    return f"{type(error).__name__}: {message}"


def is_timed(pipeline: Picking, condition: BaseAsset) -> bool:
    """Whether time alone can change what the pipeline's queue allows."""
    return (
        pipeline.batch is not None
        or pipeline.debounce_s is not None
        or any(node.window or node.reset for node in _timed_ands(condition))
    )


def pick_run(
    pipeline: Picking,
    condition: BaseAsset,
    rows: list[Queued],
    registry: Registry,
    alias_members: dict[int, set[AssetAlias]],
    now: datetime,
) -> Pick:
    """The rows of the next run of ``pipeline`` (scheduled on ``condition``) among its queue
    ``rows``, oldest first, at ``now``. Rows its current schedule cannot consume (assets it no
    longer names, plain rows of a partitioned pipeline and the reverse) are never picked."""
    candidates = {registry.asset_ids[a] for a in condition.iter_assets()} | set(alias_members)
    partitioned = isinstance(pipeline.schedule, PartitionedAssetTimetable)
    rows = [
        row
        for row in rows
        if row.asset_id in candidates and (row.partition_key is not None) == partitioned
    ]
    clock = _Clock(condition, registry, alias_members, now)
    dropped = clock.dropped(rows)
    if dropped:
        gone = {drop.row.row_id for drop in dropped}
        rows = [row for row in rows if row.row_id not in gone]
    chooser = _Chooser(pipeline, condition, registry, alias_members, now)
    if isinstance(pipeline.schedule, PartitionedAssetTimetable):
        pick = chooser.pick_partition(pipeline.schedule, rows)
    else:
        picked, problem, due = chooser.pick(rows)
        pick = Pick(picked, None, [problem] if problem else [], due=due)
    due = _earliest(pick.due, clock.due(rows))
    return dataclasses.replace(pick, dropped=dropped, due=due)


def _earliest(*times: datetime | None) -> datetime | None:
    return min((time for time in times if time is not None), default=None)


def _timed_ands(condition: BaseAsset) -> Iterator[AssetAll]:
    """The ANDs of ``condition`` with a window or a reset, outermost first."""
    if isinstance(condition, AssetAll) and (condition.window or condition.reset):
        yield condition
    if isinstance(condition, (AssetAll, AssetAny)):
        for item in condition.objects:
            yield from _timed_ands(item)


class _Clock:
    """What time does to a pipeline's queue: expiries under windows, clearing at resets."""

    def __init__(
        self,
        condition: BaseAsset,
        registry: Registry,
        alias_members: dict[int, set[AssetAlias]],
        now: datetime,
    ) -> None:
        self._registry = registry
        self._alias_members = alias_members
        self._now = now
        #: By asset id, how long its events stay queued (an asset named anywhere outside a
        #: window stays: it is absent here).
        self._lifetimes: dict[int, timedelta] = {}
        for leaf, span in lifetimes(condition).items():
            for asset_id in self._asset_ids(leaf):
                self._lifetimes[asset_id] = max(span, self._lifetimes.get(asset_id, span))
        #: The resets: the asset ids each clears, its cron and time zone.
        self._resets = [
            (self._asset_ids(node), node.reset, node.reset_timezone)
            for node in _timed_ands(condition)
            if node.reset is not None
        ]

    def _asset_ids(self, condition: BaseAsset) -> set[int]:
        return _asset_ids(condition, self._registry, self._alias_members)

    def dropped(self, rows: list[Queued]) -> list[Dropped]:
        """The rows that have expired, or that a reset has cleared, by ``now``."""
        dropped: list[Dropped] = []
        resets = [
            (asset_ids, _last_tick(cron, zone, self._now)) for asset_ids, cron, zone in self._resets
        ]
        for row in rows:
            lifetime = self._lifetimes.get(row.asset_id)
            if lifetime is not None and row.at + lifetime <= self._now:
                dropped.append(Dropped(row, "expired", row.at + lifetime))
                continue
            for asset_ids, tick in resets:
                if row.asset_id in asset_ids and row.queued_at < tick:
                    dropped.append(Dropped(row, "reset", tick))
                    break
        return dropped

    def due(self, rows: list[Queued]) -> datetime | None:
        """The next time one of ``rows`` expires or a reset clears some of them."""
        expiries = (
            row.at + self._lifetimes[row.asset_id]
            for row in rows
            if row.asset_id in self._lifetimes
        )
        ticks = (
            _next_tick(cron, zone, self._now)
            for asset_ids, cron, zone in self._resets
            if any(row.asset_id in asset_ids for row in rows)
        )
        return _earliest(*expiries, *ticks)


def _asset_ids(
    condition: BaseAsset, registry: Registry, alias_members: dict[int, set[AssetAlias]]
) -> set[int]:
    """The ids of the assets ``condition`` names, and of the members of its aliases."""
    ids = {registry.asset_ids[a] for a in condition.iter_assets()}
    aliases = set(condition.iter_aliases())
    ids.update(asset_id for asset_id, through in alias_members.items() if through & aliases)
    return ids


def _zoned(now: datetime, zone: str | None) -> datetime:
    return now.astimezone(zoneinfo.ZoneInfo(zone) if zone else UTC)


def _last_tick(cron: str, zone: str | None, now: datetime) -> datetime:
    """The last tick of ``cron`` (in ``zone``, UTC without one) at or before ``now``."""
    # croniter's previous tick is strictly before its start: start just after now.
    tick: datetime = croniter(cron, _zoned(now, zone) + timedelta(microseconds=1)).get_prev(
        datetime
    )
    return tick.astimezone(UTC)


def _next_tick(cron: str, zone: str | None, now: datetime) -> datetime:
    return next_tick(cron, _zoned(now, zone)).astimezone(UTC)


class _Chooser:
    def __init__(
        self,
        pipeline: Picking,
        condition: BaseAsset,
        registry: Registry,
        alias_members: dict[int, set[AssetAlias]],
        now: datetime,
    ) -> None:
        self._pipeline = pipeline
        self._condition = condition
        self._registry = registry
        self._alias_members = alias_members
        self._now = now

    def pick(self, rows: list[Queued]) -> tuple[list[Queued], str | None, datetime | None]:
        """The rows of one run (none when the condition does not hold, or a batch or a
        debounce holds it back), why they wait, and until when a batch or debounce holds."""
        by_asset: dict[int, list[Queued]] = defaultdict(list)
        for row in rows:
            by_asset[row.asset_id].append(row)

        def earliest(choice: Choice) -> tuple[int, int]:
            return max(row.row_id for row in choice), len(choice)

        def fewest(choice: Choice) -> tuple[int, int]:
            return len(choice), max(row.row_id for row in choice)

        batch = self._pipeline.batch
        limit = batch.max_events if batch is not None else self._pipeline.max_events_per_run
        choice = self._choose(self._condition, by_asset, earliest)
        if choice is not None and limit is not None and len(choice) > limit:
            choice = self._choose(self._condition, by_asset, fewest)
            if choice is not None and len(choice) > limit:
                names = ", ".join(sorted(self._name(row.asset_id) for row in choice))
                return (
                    [],
                    f"max_events_per_run={limit} is too small for {self._condition}: a run "
                    f"needs {len(choice)} events ({names}), so they stay queued",
                    None,
                )
        if choice is None:
            return [], None, None
        held_until = self._held_until(rows)
        if held_until is not None:
            return [], None, held_until
        required = sorted(choice, key=lambda row: row.row_id)
        if self._pipeline.run_policy == "per_event":
            return required, None, None
        others = [row for row in rows if row not in choice]
        room = len(others) if limit is None else limit - len(required)
        return sorted(required + others[:room], key=lambda row: row.row_id), None, None

    def _held_until(self, rows: list[Queued]) -> datetime | None:
        """While a batch or a debounce holds the run back: until when, at the latest (``None``:
        it may start now)."""
        batch, debounce_s = self._pipeline.batch, self._pipeline.debounce_s
        if batch is None and debounce_s is None:
            return None
        if batch is not None and len(rows) >= batch.max_events:
            return None
        deadlines = []
        if batch is not None:
            deadlines.append(min(row.queued_at for row in rows) + _seconds(batch.max_wait_s))
        if debounce_s is not None:
            deadlines.append(max(row.queued_at for row in rows) + _seconds(debounce_s))
        deadline = min(deadlines)
        return None if deadline <= self._now else deadline

    def pick_partition(self, schedule: PartitionedAssetTimetable, rows: list[Queued]) -> Pick:
        """The rows of the oldest mapped partition key whose condition holds now."""
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
        due: datetime | None = None
        for key, key_rows in by_key.items():
            picked, problem, held_until = self.pick(key_rows)
            if picked:
                return Pick(picked, key, [])
            if problem is not None and problem not in problems:
                problems.append(problem)
            due = _earliest(due, held_until)
        return Pick([], None, problems, due=due)

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
        by_asset: dict[int, list[Queued]],
        rank: Callable[[Choice], tuple[int, int]],
    ) -> Choice | None:
        """Rows of assets that satisfy ``condition``, the least by ``rank`` at each OR;
        ``None`` when it does not hold. When no asset appears twice in the condition, ranking
        by size gives the smallest choice; otherwise a satisfying one, maybe larger."""
        if isinstance(condition, Asset):
            asset_id = self._registry.asset_ids.get(condition)
            queued = by_asset.get(asset_id) if asset_id is not None else None
            return frozenset({queued[0]}) if queued else None
        if isinstance(condition, AssetAlias):
            oldest = [
                queued[0]
                for asset_id, queued in by_asset.items()
                if queued and condition in self._alias_members.get(asset_id, ())
            ]
            if not oldest:
                return None
            return frozenset({min(oldest, key=lambda row: row.row_id)})
        if isinstance(condition, AssetAll):
            if condition.window is not None:
                return self._choose_within(condition, condition.window, by_asset, rank)
            return self._choose_all(condition, by_asset, rank)
        if isinstance(condition, AssetAny):
            options = [
                option
                for item in condition.objects
                if (option := self._choose(item, by_asset, rank)) is not None
            ]
            return min(options, key=rank) if options else None
        raise TypeError(
            f"cannot pick events for condition {condition!r}: it is not an Asset, AssetAlias, "
            "AssetAll or AssetAny"
        )

    def _choose_all(
        self,
        condition: AssetAll,
        by_asset: dict[int, list[Queued]],
        rank: Callable[[Choice], tuple[int, int]],
    ) -> Choice | None:
        choice: Choice = frozenset()
        for item in condition.objects:
            part = self._choose(item, by_asset, rank)
            if part is None:
                return None
            choice |= part
        return choice

    def _choose_within(
        self,
        condition: AssetAll,
        window: timedelta,
        by_asset: dict[int, list[Queued]],
        rank: Callable[[Choice], tuple[int, int]],
    ) -> Choice | None:
        """The earliest rows that satisfy ``condition`` with timestamps within ``window`` of
        each other: for each event time, oldest first, the AND over the events from then until
        ``window`` later."""
        asset_ids = _asset_ids(condition, self._registry, self._alias_members) & by_asset.keys()
        starts = sorted({row.at for asset_id in asset_ids for row in by_asset[asset_id]})
        for start in starts:
            inside = {
                asset_id: [row for row in queued if start <= row.at <= start + window]
                if asset_id in asset_ids
                else queued
                for asset_id, queued in by_asset.items()
            }
            choice = self._choose_all(condition, inside, rank)
            if choice is not None:
                return choice
        return None

    def _name(self, asset_id: int) -> str:
        asset = self._registry.assets.get(asset_id)
        return asset.name if asset is not None else f"#{asset_id}"


def _seconds(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)
