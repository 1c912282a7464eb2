"""Part leases on the real store (SQLite and PostgreSQL): a shareable trigger's parts (Kinesis
shards) spread over two daemons, moved when one gives them up or its rows expire, and ingest
storing no event of a part whose lease its daemon lost (the fence)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from tests.fixtures.ingest import ingest_all, watched_inbox
from triggerer.service.daemon.ingest import Ingest
from triggerer.service.daemon.leases import Leases
from triggerer.service.daemon.part_leases import StoredPartLeases
from triggerer.service.store import models, session_factory
from triggerer.service.store.source_checkpoints import stored_positions
from triggerer.service.store.types import utcnow
from triggerer.triggers import TriggerEvent

GROUP = "kinesis/orders/app/"
SHARDS = [f"shardId-{n:012d}" for n in range(4)]


def _daemon(
    sessions: async_sessionmaker[AsyncSession], owner: str, ttl_s: float = 3600
) -> tuple[Leases, StoredPartLeases]:
    leases = Leases(sessions, owner, ttl_s=ttl_s)
    return leases, StoredPartLeases(sessions, leases, interval_s=0.1, ttl_s=ttl_s)


async def _rows(sessions: async_sessionmaker[AsyncSession]) -> dict[str, str]:
    async with sessions() as session:
        rows = await session.execute(select(models.Lease.name, models.Lease.owner))
        return dict(rows.all())


async def test_two_daemons_share_the_parts_and_one_takes_all_when_the_other_leaves(
    migrated_engine: AsyncEngine,
) -> None:
    sessions = session_factory(migrated_engine)
    a_leases, a = _daemon(sessions, "a")
    _, b = _daemon(sessions, "b")

    alone = await a.balance(GROUP, SHARDS)
    assert set(alone) == set(SHARDS)
    assert a_leases.held == {GROUP + shard for shard in SHARDS} | {GROUP + "@member/a"}
    assert await b.balance(GROUP, SHARDS) == {}  # nothing free yet: b is a member now
    kept = await a.balance(GROUP, SHARDS)  # a sees b and gives up what is past its share
    assert set(kept) == set(SHARDS[:2])
    assert {shard: alone[shard] for shard in kept} == kept  # kept: the same tenures
    taken = await b.balance(GROUP, SHARDS)
    assert set(taken) == set(SHARDS[2:])
    rows = await _rows(sessions)
    assert {name: owner for name, owner in rows.items() if "@member/" not in name} == {
        GROUP + shard: "a" if shard in kept else "b" for shard in SHARDS
    }

    await b.release(GROUP)
    assert set(await a.balance(GROUP, SHARDS)) == set(SHARDS)
    assert await _rows(sessions) == {GROUP + shard: "a" for shard in SHARDS} | {
        GROUP + "@member/a": "a"
    }


async def test_the_parts_of_a_daemon_that_died_are_taken_once_its_rows_expire(
    migrated_engine: AsyncEngine,
) -> None:
    sessions = session_factory(migrated_engine)
    _, a = _daemon(sessions, "a")
    _, b = _daemon(sessions, "b")
    assert len(await a.balance(GROUP, SHARDS)) == 4
    assert await b.balance(GROUP, SHARDS) == {}
    # a is dead: it renews no more, and its rows expire (in the store, not by waiting: a wait
    # as long as a lease would be a race with a busy machine).
    async with sessions.begin() as session:
        await session.execute(
            update(models.Lease)
            .where(models.Lease.owner == "a")
            .values(expires_at=utcnow() - timedelta(seconds=1))
        )
    held = await b.balance(GROUP, SHARDS)
    assert set(held) == set(SHARDS)
    rows = await _rows(sessions)
    assert GROUP + "@member/a" not in rows  # a dead member's row is deleted
    assert set(rows.values()) == {"b"}


async def test_parts_no_longer_offered_are_given_up(migrated_engine: AsyncEngine) -> None:
    """A shard stored as read to its end is no longer offered: its lease goes."""
    sessions = session_factory(migrated_engine)
    _, a = _daemon(sessions, "a")
    await a.balance(GROUP, SHARDS)
    assert set(await a.balance(GROUP, SHARDS[1:])) == set(SHARDS[1:])
    assert GROUP + SHARDS[0] not in await _rows(sessions)


def _event(shard: str, n: int, fence: tuple[str, str] | None) -> TriggerEvent:
    return TriggerEvent(
        {"n": n},
        dedup_key=f"orders/{shard}/{n}",
        checkpoint=(GROUP + shard, str(n)),
        fence=fence,
    )


async def test_ingest_stores_no_event_nor_position_of_a_part_whose_lease_was_lost(
    migrated_engine: AsyncEngine, tmp_path: Path
) -> None:
    """a read shards 0 and 1, then lost shard 1 to b (a gave it up, b took it): of a's batch,
    shard 0's events and position are stored, shard 1's are not; b's events of shard 1 are.
    A tenure lost never comes back: a taking shard 1 again starts a new one."""
    sessions = session_factory(migrated_engine)
    watched = await watched_inbox(sessions, tmp_path)
    _, a = _daemon(sessions, "a")
    _, b = _daemon(sessions, "b")
    first = await a.balance(GROUP, SHARDS[:2])
    await b.balance(GROUP, SHARDS[:2])
    await a.balance(GROUP, SHARDS[:2])  # gives shard 1 up for b
    taken = await b.balance(GROUP, SHARDS[:2])
    assert set(taken) == {SHARDS[1]}

    a_ingest = Ingest(sessions, lambda _: None, batch_size=10, owner="a")
    await ingest_all(
        a_ingest,
        [(watched, _event(shard, n, first[shard])) for n in (1, 2) for shard in SHARDS[:2]],
    )
    b_ingest = Ingest(sessions, lambda _: None, batch_size=10, owner="b")
    await ingest_all(b_ingest, [(watched, _event(SHARDS[1], 1, taken[SHARDS[1]]))])

    async with sessions() as session:
        keys = await session.scalars(select(models.AssetEvent.dedup_key))
        assert sorted(key or "" for key in keys) == [
            f"orders/{SHARDS[0]}/1",
            f"orders/{SHARDS[0]}/2",
            f"orders/{SHARDS[1]}/1",
        ]
        assert await stored_positions(session, GROUP) == {
            GROUP + SHARDS[0]: "2",
            GROUP + SHARDS[1]: "1",
        }
    assert (a_ingest.events_recorded, b_ingest.events_recorded) == (2, 1)

    await b.release(GROUP)
    again = await a.balance(GROUP, SHARDS[:2])
    assert again[SHARDS[1]] != first[SHARDS[1]]
    stale = Ingest(sessions, lambda _: None, batch_size=10, owner="a")
    await ingest_all(stale, [(watched, _event(SHARDS[1], 3, first[SHARDS[1]]))])
    async with sessions() as session:
        count = select(func.count()).select_from(models.AssetEvent)
        assert await session.scalar(count) == 3
