"""Leases on the real store: one owner at a time, taken over once expired."""

from __future__ import annotations

import anyio
from sqlalchemy.ext.asyncio import AsyncEngine

from triggerer.service.daemon.leases import Leases
from triggerer.service.store import session_factory


async def test_one_owner_at_a_time_and_takeover_after_expiry(migrated_engine: AsyncEngine) -> None:
    sessions = session_factory(migrated_engine)
    first = Leases(sessions, "instance-a", ttl_s=0.5)
    second = Leases(sessions, "instance-b", ttl_s=0.5)

    assert await first.claim("trigger:1")
    assert not await second.claim("trigger:1")
    assert await second.claim("trigger:2")
    assert await first.renew() == set()

    with anyio.fail_after(5):
        while not await second.claim("trigger:1"):  # noqa: ASYNC110 - expiry is in the DB
            await anyio.sleep(0.1)
    assert await first.renew() == {"trigger:1"}
    assert first.held == set()
    assert second.held == {"trigger:1", "trigger:2"}


async def test_concurrent_claims_have_one_winner(migrated_engine: AsyncEngine) -> None:
    sessions = session_factory(migrated_engine)
    contenders = [Leases(sessions, f"instance-{n}", ttl_s=30) for n in range(5)]
    won: list[bool] = []

    async def claim(leases: Leases) -> None:
        won.append(await leases.claim("trigger:9"))

    async with anyio.create_task_group() as group:
        for leases in contenders:
            group.start_soon(claim, leases)
    assert won.count(True) == 1


async def test_a_released_lease_is_free_at_once(migrated_engine: AsyncEngine) -> None:
    sessions = session_factory(migrated_engine)
    first = Leases(sessions, "instance-a", ttl_s=3600)
    second = Leases(sessions, "instance-b", ttl_s=3600)
    assert await first.claim("trigger:1")
    assert await first.claim("trigger:2")

    await second.release("trigger:1")  # not its lease: nothing happens
    assert not await second.claim("trigger:1")
    await first.release("trigger:1")

    assert first.held == {"trigger:2"}
    assert await second.claim("trigger:1")  # an hour before the lease would have expired
    assert not await second.claim("trigger:2")
