"""What a running pipeline sees: outlet events, alias outlets and lazy inlet events."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import pytest

from triggerer import Asset, AssetAlias, AssetEvent, RunContext
from triggerer.context import AliasOutlet, InletEvents, OutletEvent, OutletEvents

report, orders, dim = Asset("report"), Asset("orders"), Asset("dim")
alias = AssetAlias("out")


def _event(event_id: int, asset: Asset) -> AssetEvent:
    return AssetEvent(
        id=event_id,
        asset=asset,
        extra={"n": event_id},
        timestamp=datetime(2026, 1, 1, 0, 0, event_id, tzinfo=UTC),
        source="test",
    )


# --- outlet events --------------------------------------------------------------------------


def test_outlet_events_getitem_asset_gives_its_pending_event() -> None:
    outlets = OutletEvents([report, alias])
    event = outlets[report]
    assert isinstance(event, OutletEvent)
    assert (event.asset, event.extra) == (report, {})
    event.extra = {"row_count": 3}
    assert outlets[report].extra == {"row_count": 3}
    assert outlets.assets() == [event]


def test_outlet_events_getitem_uses_identity_not_extra() -> None:
    outlets = OutletEvents([report])
    assert outlets[Asset("report", extra={"x": 1})] is outlets[report]


def test_outlet_events_getitem_alias_gives_an_alias_outlet() -> None:
    outlets = OutletEvents([report, alias])
    alias_outlet = outlets[alias]
    assert isinstance(alias_outlet, AliasOutlet)
    assert alias_outlet.alias == alias
    assert outlets.aliases() == [alias_outlet]


@pytest.mark.parametrize("key", [orders, AssetAlias("other"), AssetAlias("report")])
def test_outlet_events_unknown_key_names_the_outlets(key: Asset | AssetAlias) -> None:
    outlets = OutletEvents([report, alias])
    with pytest.raises(KeyError) as info:
        outlets[key]
    message = str(info.value)
    assert repr(key) in message
    assert "Asset('report')" in message
    assert "AssetAlias('out')" in message


def test_outlet_events_without_outlets_says_none() -> None:
    with pytest.raises(KeyError, match="outlets: none"):
        OutletEvents([])[report]


def test_alias_add_records_asset_and_extra() -> None:
    outlet = AliasOutlet(alias)
    outlet.add(orders, extra={"k": 1})
    outlet.add(report)
    assert outlet.added == [(orders, {"k": 1}), (report, {})]


def test_alias_add_same_asset_and_extra_once() -> None:
    outlet = AliasOutlet(alias)
    outlet.add(orders, extra={"k": 1})
    outlet.add(Asset("orders"), extra={"k": 1})
    assert outlet.added == [(orders, {"k": 1})]


def test_alias_add_same_asset_with_other_extra_twice() -> None:
    outlet = AliasOutlet(alias)
    outlet.add(orders, extra={"k": 1})
    outlet.add(orders, extra={"k": 2})
    assert outlet.added == [(orders, {"k": 1}), (orders, {"k": 2})]


def test_alias_add_copies_extra() -> None:
    outlet = AliasOutlet(alias)
    extra = {"k": 1}
    outlet.add(orders, extra=extra)
    extra["k"] = 2
    assert outlet.added == [(orders, {"k": 1})]


def test_alias_add_rejects_a_non_asset() -> None:
    with pytest.raises(TypeError, match="needs an Asset, got str"):
        AliasOutlet(alias).add("orders")  # type: ignore[arg-type]


# --- inlet events ---------------------------------------------------------------------------


class _Loader:
    def __init__(self) -> None:
        self.calls: list[Asset] = []

    def __call__(self, asset: Asset) -> Sequence[AssetEvent]:
        self.calls.append(asset)
        return [_event(1, asset), _event(2, asset), _event(3, asset)]


def test_inlet_events_load_nothing_until_read() -> None:
    loader = _Loader()
    inlets = InletEvents([orders, dim], loader)
    assert list(inlets) == [orders, dim]
    assert len(inlets) == 2
    assert loader.calls == []


def test_inlet_events_load_each_asset_once_when_read() -> None:
    loader = _Loader()
    inlets = InletEvents([orders, dim], loader)
    first = inlets[orders]
    again = inlets[orders]
    assert first is again
    assert loader.calls == [orders]
    inlets[dim]
    assert loader.calls == [orders, dim]


def test_inlet_events_last_is_latest() -> None:
    inlets = InletEvents([orders], _Loader())
    assert inlets[orders][-1].id == 3
    assert [e.id for e in inlets[orders]] == [1, 2, 3]


def test_inlet_events_unknown_asset_is_a_key_error() -> None:
    loader = _Loader()
    with pytest.raises(KeyError, match="not an inlet"):
        InletEvents([orders], loader)[dim]
    assert loader.calls == []


def test_inlet_events_membership_does_not_load() -> None:
    loader = _Loader()
    inlets = InletEvents([orders], loader)
    assert orders in inlets
    assert dim not in inlets
    assert loader.calls == []


# --- run context ----------------------------------------------------------------------------


def test_run_context_defaults() -> None:
    context = RunContext(
        run_id="r1",
        pipeline_id="p",
        triggering_asset_events={orders: [_event(1, orders)]},
        inlet_events=InletEvents([], _Loader()),
        outlet_events=OutletEvents([report]),
    )
    assert context.logical_date is None
    assert context.partition_key is None
    assert context.params == {}
    assert context.triggering_asset_events[orders][0].id == 1
