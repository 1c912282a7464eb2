"""What a running pipeline sees: its run, the events that triggered it, and its outlets."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, overload

from triggerer.assets import Asset, AssetAlias


@dataclasses.dataclass(frozen=True)
class AssetEvent:
    """One event on an asset, as stored in the metadata database."""

    id: int
    asset: Asset
    extra: dict[str, Any]
    timestamp: datetime
    source: str
    partition_key: str | None = None
    source_run_id: str | None = None


@dataclasses.dataclass
class OutletEvent:
    """The pending event on one outlet asset; set ``extra`` to describe what the run wrote."""

    asset: Asset
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class AliasOutlet:
    """The assets a run adds through one alias, each with the extra of its event."""

    alias: AssetAlias
    added: list[tuple[Asset, dict[str, Any]]] = dataclasses.field(default_factory=list)

    def add(self, asset: Asset, extra: dict[str, Any] | None = None) -> None:
        """Emit an event on ``asset`` through this alias (the asset is created if unknown)."""
        if not isinstance(asset, Asset):
            raise TypeError(f"{self.alias!r}.add() needs an Asset, got {type(asset).__name__}")
        entry = (asset, dict(extra or {}))
        if entry not in self.added:
            self.added.append(entry)


class OutletEvents:
    """``context.outlet_events[asset].extra = {...}`` and ``[alias].add(asset, extra=...)``."""

    def __init__(self, outlets: Sequence[Asset | AssetAlias]) -> None:
        self._assets = {o: OutletEvent(o) for o in outlets if isinstance(o, Asset)}
        self._aliases = {o: AliasOutlet(o) for o in outlets if isinstance(o, AssetAlias)}

    @overload
    def __getitem__(self, key: Asset) -> OutletEvent: ...
    @overload
    def __getitem__(self, key: AssetAlias) -> AliasOutlet: ...
    def __getitem__(self, key: Asset | AssetAlias) -> OutletEvent | AliasOutlet:
        table: Mapping[Any, OutletEvent | AliasOutlet] = (
            self._aliases if isinstance(key, AssetAlias) else self._assets
        )
        try:
            return table[key]
        except KeyError:
            known = ", ".join(map(repr, [*self._assets, *self._aliases])) or "none"
            raise KeyError(
                f"{key!r} is not an outlet of this pipeline (outlets: {known})"
            ) from None

    def assets(self) -> list[OutletEvent]:
        return list(self._assets.values())

    def aliases(self) -> list[AliasOutlet]:
        return list(self._aliases.values())


class InletEvents(Mapping[Asset | AssetAlias, Sequence[AssetEvent]]):
    """Events of each inlet asset, oldest first, fetched only when first read; of an inlet
    alias, the events emitted through it."""

    def __init__(
        self,
        inlets: Sequence[Asset | AssetAlias],
        load: Callable[[Asset | AssetAlias], Sequence[AssetEvent]],
    ) -> None:
        self._inlets = tuple(inlets)
        self._load = load
        self._loaded: dict[Asset | AssetAlias, Sequence[AssetEvent]] = {}

    def __getitem__(self, inlet: Asset | AssetAlias) -> Sequence[AssetEvent]:
        if inlet not in self._inlets:
            raise KeyError(f"{inlet!r} is not an inlet of this pipeline")
        if inlet not in self._loaded:
            self._loaded[inlet] = self._load(inlet)
        return self._loaded[inlet]

    def __contains__(self, inlet: object) -> bool:
        return inlet in self._inlets

    def __iter__(self) -> Iterator[Asset | AssetAlias]:
        return iter(self._inlets)

    def __len__(self) -> int:
        return len(self._inlets)


@dataclasses.dataclass
class RunContext:
    """Passed to a pipeline function as ``context``."""

    run_id: str
    pipeline_id: str
    triggering_asset_events: Mapping[Asset, Sequence[AssetEvent]]
    inlet_events: Mapping[Asset | AssetAlias, Sequence[AssetEvent]]
    outlet_events: OutletEvents
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    partition_key: str | None = None
    logical_date: datetime | None = None
    try_number: int = 1
    trace_context: str | None = None
    """The W3C ``traceparent`` of the run's span when the daemon traces (``[tracing]``), for
    the pipeline's own spans to start under (also in the ``TRACEPARENT`` environment
    variable); None when it does not."""
