"""A run's inlet events, served by the daemon on the real store: the pipeline's inlets are
answered (an alias with the events emitted through it), others refused, and a run that goes
away before its answer (a timeout, a cancel) leaves the daemon serving the next one. Without a
store (``pipelines test`` when it cannot read one), each inlet's answer is the reason."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import msgspec

from triggerer.assets import Asset, AssetAlias
from triggerer.service.runs.inlets import serving
from triggerer.service.runs.spec import InletAnswer, InletRequest
from triggerer.service.store import models, session_factory

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

ORDERS = Asset("orders", "s3://lake/orders")
EVENTS = 2_000
"""Each with a 1 kB extra: an answer far larger than a socket's buffer."""


async def test_inlets_are_answered_and_a_run_gone_mid_answer_stops_nothing(
    migrated_engine: AsyncEngine,
) -> None:
    sessions = session_factory(migrated_engine)
    async with sessions.begin() as session:
        asset = models.Asset(name=ORDERS.name, uri=ORDERS.uri)
        session.add(asset)
        await session.flush()
        session.add_all(
            models.AssetEvent(
                asset_id=asset.id, extra={"n": n, "pad": "x" * 1000}, source="rest_api"
            )
            for n in range(EVENTS)
        )

    async with serving(sessions, [ORDERS]) as path:
        with anyio.fail_after(60):
            gone = await anyio.connect_unix(path)  # asks, then leaves before the answer
            await gone.send(_request(ORDERS))
            await gone.aclose()
            refused = await _ask(path, Asset("payments", "s3://lake/payments"))
            answered = await _ask(path, ORDERS)

    assert refused.error is not None
    assert "'payments' (s3://lake/payments) is not an inlet" in refused.error
    assert answered.error is None
    assert [event.extra["n"] for event in answered.events] == list(range(EVENTS))


async def test_an_inlet_alias_is_answered_with_the_events_emitted_through_it(
    migrated_engine: AsyncEngine,
) -> None:
    sessions = session_factory(migrated_engine)
    async with sessions.begin() as session:
        alias = models.AssetAlias(name="lake-writes")
        other = models.AssetAlias(name="elsewhere")
        orders = models.Asset(name=ORDERS.name, uri=ORDERS.uri)
        returns = models.Asset(name="returns", uri="s3://lake/returns")
        session.add_all([alias, other, orders, returns])
        await session.flush()
        events = [
            models.AssetEvent(asset_id=asset.id, extra={"n": n}, source="run")
            for n, asset in enumerate([orders, returns, orders, returns])
        ]
        session.add_all(events)
        await session.flush()
        session.add_all(  # the first three through the alias, the last through another
            models.AssetEventAlias(event_id=event.id, alias_id=through.id)
            for event, through in zip(events, [alias, alias, alias, other], strict=True)
        )

    async with serving(sessions, [AssetAlias("lake-writes"), ORDERS]) as path:
        with anyio.fail_after(60):
            answered = await _ask(path, AssetAlias("lake-writes"))
            refused = await _ask(path, AssetAlias("elsewhere"))

    assert answered.error is None
    assert [(event.asset.name, event.extra["n"]) for event in answered.events] == [
        ("orders", 0),
        ("returns", 1),
        ("orders", 2),
    ]
    assert refused.error == "alias 'elsewhere' is not an inlet of this pipeline"


def _request(inlet: Asset | AssetAlias) -> bytes:
    uri = inlet.uri if isinstance(inlet, Asset) else None
    return msgspec.json.encode(InletRequest(inlet.name, uri)) + b"\n"


async def _ask(path: str, inlet: Asset | AssetAlias) -> InletAnswer:
    async with await anyio.connect_unix(path) as connection:
        await connection.send(_request(inlet))
        chunks = []
        try:
            while True:
                chunks.append(await connection.receive())
        except anyio.EndOfStream:
            pass
    return msgspec.json.decode(b"".join(chunks), type=InletAnswer)


async def test_without_a_store_each_inlet_is_answered_with_the_reason() -> None:
    """As ``pipelines test`` serves them when the configured store cannot be read."""
    async with serving(None, [ORDERS], "no database at /x.db") as path:
        with anyio.fail_after(60):
            refused = await _ask(path, Asset("payments", "s3://lake/payments"))
            answered = await _ask(path, ORDERS)
    assert refused.error is not None
    assert "'payments' (s3://lake/payments) is not an inlet" in refused.error
    assert answered == InletAnswer(error="no database at /x.db")
