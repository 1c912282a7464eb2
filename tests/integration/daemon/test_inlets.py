"""A run's inlet events, served by the daemon on the real store: the pipeline's inlets are
answered, others refused, and a run that goes away before its answer (a timeout, a cancel)
leaves the daemon serving the next one. Without a store (``pipelines test`` when it cannot
read one), each inlet's answer is the reason."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import msgspec

from triggerer.assets import Asset
from triggerer.service.runs.inlets import serving
from triggerer.service.runs.spec import InletAnswer, SpecAsset
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


def _request(asset: Asset) -> bytes:
    return msgspec.json.encode(SpecAsset(asset.name, asset.uri)) + b"\n"


async def _ask(path: str, asset: Asset) -> InletAnswer:
    async with await anyio.connect_unix(path) as connection:
        await connection.send(_request(asset))
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
