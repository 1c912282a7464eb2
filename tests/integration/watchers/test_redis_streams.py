"""RedisStreamTrigger against the machine's Redis: payload and dedup key, XACK only once acked,
redelivery of what was not, dead letters, trimmed entries, lag, and ``send``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import pytest
import redis.asyncio
from structlog.testing import capture_logs

from tests.fixtures.redis import SHARED_REDIS_HOST, SHARED_REDIS_PORT, create_stream
from tests.fixtures.triggers import running, take
from triggerer import connections
from triggerer.triggers import SourceMissing, TriggerEvent, load_trigger
from watchers import MessageQueueTrigger, RedisStreamTrigger
from watchers.redis.streams import PROVIDER, RedisStreamMissing, send

if TYPE_CHECKING:
    from deploy.local.services import Service
    from tests.fixtures.redis import MakeStream


def refuse_poison(payload: dict[str, Any]) -> dict[str, Any]:
    """An apply_function for the tests that fails on the body "poison"."""
    if payload["body"] == "poison":
        raise ValueError("poison refused")
    return payload


def uri(stream: str) -> str:
    return f"redis+stream://{SHARED_REDIS_HOST}:{SHARED_REDIS_PORT}/0/{stream}"


def trigger(stream: str, **options: Any) -> RedisStreamTrigger:
    made = MessageQueueTrigger(uri(stream), start_id="0", block_ms=100, **options)
    assert isinstance(made, RedisStreamTrigger)
    return made


async def pending(client: redis.asyncio.Redis, stream: str, group: str) -> int:
    summary = await client.xpending(stream, group)
    return int(summary["pending"])


async def test_payload_and_dedup_key(
    shared_redis: redis.asyncio.Redis, make_stream: MakeStream
) -> None:
    stream = await make_stream()
    json_id = (await shared_redis.xadd(stream, {"body": '{"order": 7}', "kind": "new"})).decode()
    [text_id] = await send(uri(stream), ["plain text"])
    source = trigger(stream)
    async with running(source) as events:
        first, second = await take(events, 2)
    assert first.payload == {
        "stream": stream,
        "id": json_id,
        "timestamp_ms": int(json_id.split("-")[0]),
        "body": {"order": 7},
        "fields": {"kind": "new"},
    }
    assert first.dedup_key == f"{stream}/{json_id}"
    assert first.sent_at == int(json_id.split("-")[0]) / 1000
    assert first.dead_letter is None
    assert second.payload["body"] == "plain text"
    assert second.dedup_key == f"{stream}/{text_id}"
    assert source.reads_as == f"triggerer-{stream}"
    assert source.messages == source.events == 2


async def test_entries_are_acked_only_once_their_events_are(
    shared_redis: redis.asyncio.Redis, make_stream: MakeStream
) -> None:
    stream = await make_stream()
    await send(uri(stream), ["a", "b"])
    source = trigger(stream)
    group = source.consumer_group
    async with running(source) as events:
        first, second = await take(events, 2)
        assert await pending(shared_redis, stream, group) == 2
        assert first.ack is not None
        await first.ack()
        await first.ack()  # a second ack of one event changes nothing
    # cleanup sends the acks gathered; the unacked entry stays pending
    assert await pending(shared_redis, stream, group) == 1
    [row] = await shared_redis.xpending_range(stream, group, "-", "+", 10)
    assert f"{stream}/{row['message_id'].decode()}" == second.dedup_key
    assert source.acked == 1


async def test_an_unacked_entry_is_claimed_again_with_its_dedup_key(
    shared_redis: redis.asyncio.Redis, make_stream: MakeStream
) -> None:
    stream = await make_stream()
    await send(uri(stream), ["once"])
    crashed = trigger(stream, min_idle_ms=200)
    async with running(crashed) as events:
        [lost] = await take(events, 1)
    later = trigger(stream, min_idle_ms=200)
    with capture_logs() as logs:
        async with running(later) as events:
            [again] = await take(events, 1)
            assert again.ack is not None
            await again.ack()
    assert again.dedup_key == lost.dedup_key
    assert again.payload == lost.payload
    assert await pending(shared_redis, stream, later.consumer_group) == 0
    assert any(entry["event"] == "redis_stream_entries_claimed" for entry in logs)


async def test_a_consumer_held_at_a_yield_keeps_its_entries(
    shared_redis: redis.asyncio.Redis, make_stream: MakeStream
) -> None:
    """The daemon's backpressure holds the trigger at a ``yield`` (the supervisor's send
    waits) for longer than ``min_idle_ms``: its entries, the one yielded and the rest of its
    batch, are kept fresh by the reader's own task, so another consumer of the group claims
    none of them and none counts a second delivery."""
    stream = await make_stream()
    await send(uri(stream), ["a", "b", "c"])
    # Refreshed every second: a busy machine may hold the refresher up to 2 s without a claim.
    source = trigger(stream, min_idle_ms=3_000)
    group = source.consumer_group
    async with running(source) as events:
        [first] = await take(events, 1)  # held here: "b" and "c" wait in the batch read
        for _ in range(6):  # three times min_idle_ms
            await anyio.sleep(1.5)
            claimed = await shared_redis.xautoclaim(  # with justid: the ids claimed
                stream, group, "another-daemon", 3_000, justid=True
            )
            assert claimed == []
        rows = await shared_redis.xpending_range(stream, group, "-", "+", 10)
        assert [row["consumer"].decode() for row in rows] == [source._reader.consumer] * 3
        assert [row["times_delivered"] for row in rows] == [1, 1, 1]
        rest = await take(events, 2)
        for event in [first, *rest]:
            assert event.ack is not None
            await event.ack()
    assert [event.payload["body"] for event in [first, *rest]] == ["a", "b", "c"]
    assert await pending(shared_redis, stream, group) == 0


async def test_a_failed_entry_is_not_kept_fresh(
    shared_redis: redis.asyncio.Redis, make_stream: MakeStream
) -> None:
    """An entry whose processing raised is released: it goes idle, and whichever consumer of
    the group looks after ``min_idle_ms`` claims it (here another one)."""
    stream = await make_stream()
    await send(uri(stream), ["poison", "fine"])
    source = trigger(stream, min_idle_ms=300, apply_function=f"{__name__}.refuse_poison")
    group = source.consumer_group
    async with running(source) as events:
        [fine] = await take(events, 1)
        assert fine.payload["body"] == "fine"
        with anyio.fail_after(10):
            while True:
                claimed = await shared_redis.xautoclaim(
                    stream, group, "another-daemon", 300, justid=True
                )
                if claimed:
                    break
                await anyio.sleep(0.1)
    [claimed_id] = claimed
    [row] = await shared_redis.xpending_range(stream, group, "-", "+", 10, "another-daemon")
    assert row["message_id"] == claimed_id
    assert source.failed == 1


async def test_an_entry_failing_max_deliveries_times_is_a_dead_letter(
    shared_redis: redis.asyncio.Redis, make_stream: MakeStream
) -> None:
    stream = await make_stream()
    await send(uri(stream), ["one", "poison", "two"])
    source = trigger(
        stream,
        apply_function=f"{__name__}.refuse_poison",
        max_deliveries=3,
        min_idle_ms=100,
    )
    async with running(source) as events:
        taken = await take(events, 3)
        for event in taken:
            assert event.ack is not None
            await event.ack()
    assert [event.payload["body"] for event in taken] == ["one", "two", "poison"]
    letter = taken[2]
    assert letter.dead_letter is not None
    assert "ValueError: poison refused" in letter.dead_letter
    assert "delivered 3 times" in letter.dead_letter
    assert letter.dedup_key == f"{stream}/{letter.payload['id']}"
    assert source.failed == 3
    assert source.dead_lettered == 1
    assert source.acked == 3  # sent by cleanup (while running: before each read)
    assert await pending(shared_redis, stream, source.consumer_group) == 0


async def test_filtered_entries_are_acked(
    shared_redis: redis.asyncio.Redis, make_stream: MakeStream
) -> None:
    stream = await make_stream()
    await send(uri(stream), ['{"kind": "skip"}', '{"kind": "keep"}'])
    source = trigger(stream, filter={"path": "$.body.kind", "equals": "keep"})
    async with running(source) as events:
        [kept] = await take(events, 1)
    assert kept.payload["body"] == {"kind": "keep"}
    assert source.filtered == 1
    assert await pending(shared_redis, stream, source.consumer_group) == 1  # the kept one


async def test_entries_trimmed_while_pending_are_counted_lost(
    shared_redis: redis.asyncio.Redis, make_stream: MakeStream
) -> None:
    stream = await make_stream()
    await send(uri(stream), ["a", "b", "c"])
    first = trigger(stream, min_idle_ms=100)
    async with running(first) as events:
        await take(events, 3)
    await shared_redis.xtrim(stream, maxlen=1, approximate=False)  # the two oldest go while pending
    later = trigger(stream, min_idle_ms=100)
    with capture_logs() as logs:
        async with running(later) as events:
            [survivor] = await take(events, 1)
    assert survivor.payload["body"] == "c"
    assert later.lost == 2
    [lost] = [entry for entry in logs if entry["event"] == "redis_stream_entries_lost"]
    assert lost["entries"] == 2
    assert lost["stream"] == stream


async def test_a_missing_stream_is_the_watchers_error(shared_redis: redis.asyncio.Redis) -> None:
    missing = trigger("triggerer-test-never-made")
    with pytest.raises(SourceMissing, match="'triggerer-test-never-made' does not exist"):
        async with running(missing) as events:
            await anext(events)
    assert await shared_redis.exists("triggerer-test-never-made") == 0


async def test_a_key_of_another_type_is_the_watchers_error(
    shared_redis: redis.asyncio.Redis, make_stream: MakeStream
) -> None:
    stream = await make_stream()
    await shared_redis.delete(stream)
    await shared_redis.set(stream, "text")
    with pytest.raises(RedisStreamMissing, match="is a string, not a stream"):
        async with running(trigger(stream)) as events:
            await anext(events)


async def test_lag_counts_entries_not_yet_acked(
    shared_redis: redis.asyncio.Redis, make_stream: MakeStream
) -> None:
    stream = await make_stream()
    await send(uri(stream), [json.dumps({"n": n}) for n in range(5)])
    source = trigger(stream, batch_size=2)
    assert source.lag is None
    async with running(source) as events:
        await take(events, 1)
        assert source.lag == 5  # read when the trigger started: five waiting
        assert source.last_poll_at is not None


async def test_the_group_starts_at_the_watchers_first_start_by_default(
    shared_redis: redis.asyncio.Redis, make_stream: MakeStream
) -> None:
    """``start_id="$"``: the trigger's first yield stores when it first started (Redis's
    clock), and its group delivers the entries from then on."""
    stream = await make_stream()
    [before] = await send(uri(stream), ["before"])
    with anyio.fail_after(10):  # the server's clock past the entry's millisecond
        while await server_ms(shared_redis) <= int(before.split("-")[0]):  # noqa: ASYNC110
            await anyio.sleep(0.001)
    source = RedisStreamTrigger(
        host=SHARED_REDIS_HOST, port=SHARED_REDIS_PORT, stream=stream, block_ms=100
    )
    taken: list[TriggerEvent] = []

    async def made() -> bool:
        return bool(await shared_redis.xinfo_groups(stream))

    async with running(source) as events, anyio.create_task_group() as group:
        marker = await anext(events)
        assert marker.is_checkpoint_only
        assert marker.checkpoint is not None
        key, started_ms = marker.checkpoint
        assert key == (
            f"redis-stream/{SHARED_REDIS_HOST}:{SHARED_REDIS_PORT}/0/{stream}/"
            f"triggerer-{stream}/@started"
        )
        assert int(before.split("-")[0]) < int(started_ms) <= await server_ms(shared_redis)
        group.start_soon(lambda: _take_into(events, taken))
        with anyio.fail_after(10):
            while not await made():  # noqa: ASYNC110 - polling the server, no event to await
                await anyio.sleep(0.01)
        await send(uri(stream), ["after"])
    assert [event.payload["body"] for event in taken] == ["after"]


async def test_a_group_deleted_under_the_watcher_is_made_again_after_what_it_read(
    shared_redis: redis.asyncio.Redis, make_stream: MakeStream
) -> None:
    """Not at the watcher's first start (everything read since would be read again): after
    the last entry it read."""
    stream = await make_stream()
    source = RedisStreamTrigger(
        host=SHARED_REDIS_HOST, port=SHARED_REDIS_PORT, stream=stream, block_ms=100
    )
    async with running(source) as events:
        marker = await anext(events)
        assert marker.is_checkpoint_only
        [first_id] = await send(uri(stream), ["first"])
        [first] = await take(events, 1)
        assert first.ack is not None
        await first.ack()
        await shared_redis.xgroup_destroy(stream, source.consumer_group)
        await send(uri(stream), ["second"])
        [second] = await take(events, 1)
    assert (first.payload["id"], first.payload["body"]) == (first_id, "first")
    assert second.payload["body"] == "second"


async def server_ms(client: redis.asyncio.Redis) -> int:
    seconds, microseconds = await client.time()
    return int(seconds) * 1000 + int(microseconds) // 1000


async def _take_into(events: AsyncIterator[TriggerEvent], taken: list[TriggerEvent]) -> None:
    taken.extend(await take(events, 1))


async def test_send_adds_entries_and_returns_their_ids(
    shared_redis: redis.asyncio.Redis, make_stream: MakeStream
) -> None:
    stream = await make_stream()
    ids = await PROVIDER.send(uri(stream), ['{"a": 1}', "text"])  # type: ignore[misc]
    entries = await shared_redis.xrange(stream)
    assert [entry_id.decode() for entry_id, _ in entries] == ids
    assert [fields for _, fields in entries] == [{b"body": b'{"a": 1}'}, {b"body": b"text"}]


async def test_serialize_round_trip_and_the_watchers_group() -> None:
    source = trigger("orders", min_idle_ms=500)
    rebuilt = load_trigger(*source.serialize())
    assert isinstance(rebuilt, RedisStreamTrigger)
    assert rebuilt.serialize() == source.serialize()

    class Asset:
        name = "orders"
        uri = "orders://x"

    for_watcher = source.for_watcher(Asset(), "orders_stream")
    assert for_watcher.group is not None
    assert for_watcher.group.startswith("triggerer-orders_stream-")
    assert for_watcher.reads_as == for_watcher.group
    assert for_watcher.for_watcher(Asset(), "other") is for_watcher
    [exclusive] = for_watcher.exclusive_sources()
    assert for_watcher.group in exclusive


async def test_credentials_come_from_the_named_connection(
    private_redis: Service, tmp_path: Path
) -> None:
    admin = redis.asyncio.Redis(port=private_redis.port)
    await admin.acl_setuser(
        "reader",
        enabled=True,
        passwords=["+s3cret"],
        keys=["*"],
        channels=["*"],
        commands=["+@all"],
    )
    await create_stream(admin, "guarded")
    await admin.config_set("requirepass", "admin-only")
    await admin.aclose()
    address = f"redis+stream://127.0.0.1:{private_redis.port}/0/guarded"
    connections.read_from(lambda: {"guarded": {"username": "reader", "password": "s3cret"}})
    try:
        await send(address, ["hello"], connection="guarded")
        source = MessageQueueTrigger(address, start_id="0", connection="guarded")
        assert isinstance(source, RedisStreamTrigger)
        async with running(source) as events:
            [event] = await take(events, 1)
        assert event.payload["body"] == "hello"
    finally:
        connections.read_from(dict)
