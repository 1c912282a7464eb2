"""KinesisTrigger against Kinesis on a real moto server, without the daemon.

Kinesis has no ack: what a "redelivery" is here is a watcher that starts again and reads a
shard after its stored position (stored by the daemon with the events: see
tests/integration/store/test_source_checkpoints.py); here the stored positions come from a
reader installed in :mod:`triggerer.checkpoints`, as the daemon installs its store's. moto
cannot show iterator expiry, resharding or throttling (its iterators never expire, its shards
never close, it never throttles): tests/unit/test_kinesis_reader.py drives that logic with a
fake client.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any, cast

import anyio
import pytest

from triggerer import checkpoints, connections
from triggerer.triggers import TriggerEvent, load_trigger
from watchers import KinesisTrigger, MessageQueueTrigger
from watchers.kinesis import send
from watchers.kinesis_reader import KinesisClient, ShardReader

if TYPE_CHECKING:
    from tests.fixtures.kinesis import MakeStream


def reject_poison(payload: dict[str, Any]) -> dict[str, Any]:
    """An apply_function for the tests that fails on the body "poison", every time."""
    reject_poison.calls += 1  # type: ignore[attr-defined]
    if payload["body"] == "poison":
        raise ValueError("poison pill")
    return payload


reject_poison.calls = 0  # type: ignore[attr-defined]


def only_kind(payload: dict[str, Any]) -> dict[str, Any] | None:
    """An apply_function for the tests: drops bodies marked "drop", keeps kind and order."""
    body = payload["body"]
    if body.get("drop"):
        return None
    return {"kind": body["kind"], "order": body["order"]}


@contextlib.asynccontextmanager
async def running(trigger: KinesisTrigger) -> AsyncIterator[AsyncIterator[TriggerEvent]]:
    events = cast(AsyncGenerator[TriggerEvent, None], trigger.run())
    try:
        yield events
    finally:
        await events.aclose()
        await trigger.cleanup()


async def take(trigger: KinesisTrigger, count: int, timeout_s: float = 20) -> list[TriggerEvent]:
    taken: list[TriggerEvent] = []
    with anyio.fail_after(timeout_s):
        async with running(trigger) as events:
            async for event in events:
                taken.append(event)
                if len(taken) == count:
                    break
    return taken


@contextlib.contextmanager
def stored(positions: dict[str, str]) -> Iterator[None]:
    """Positions the trigger finds stored, as if the daemon had stored them."""

    async def reader(prefix: str) -> dict[str, str]:
        return {key: value for key, value in positions.items() if key.startswith(prefix)}

    previous = checkpoints._reader
    checkpoints.read_from(reader)
    try:
        yield
    finally:
        checkpoints.read_from(previous)


def uri(stream: str, moto_server: str) -> str:
    return f"kinesis://{stream}?endpoint_url={moto_server}&region=us-east-1"


async def test_payload_dedup_key_checkpoint_and_arrival(
    kinesis_stream: MakeStream, moto_server: str
) -> None:
    stream = await kinesis_stream(shards=2)
    bodies = [json.dumps({"order": n}) for n in range(6)] + ["plain text"]
    sequence_numbers = await send(uri(stream, moto_server), bodies)
    assert len(sequence_numbers) == 7

    trigger = MessageQueueTrigger(uri(stream, moto_server), poll_interval_s=0.1)
    assert isinstance(trigger, KinesisTrigger)
    events = await take(trigger, 7)

    by_body = {json.dumps(event.payload["body"]): event for event in events}
    assert set(by_body) == {*bodies[:6], '"plain text"'}
    event = by_body[bodies[0]]
    payload = event.payload
    assert set(payload) == {
        "body",
        "partition_key",
        "sequence_number",
        "shard_id",
        "approximate_arrival",
    }
    assert payload["sequence_number"] in sequence_numbers
    assert payload["shard_id"].startswith("shardId-")
    assert len(payload["partition_key"]) == 32  # send's random key
    assert event.dedup_key == f"{stream}/{payload['shard_id']}/{payload['sequence_number']}"
    assert event.checkpoint == (
        f"kinesis/{stream}/triggerer/{payload['shard_id']}",
        payload["sequence_number"],
    )
    assert event.sent_at == payload["approximate_arrival"] > 0
    assert event.ack is None
    assert event.dead_letter is None
    # Each shard's records come in their order.
    for shard in {e.payload["shard_id"] for e in events}:
        numbers = [
            int(e.payload["sequence_number"]) for e in events if e.payload["shard_id"] == shard
        ]
        assert numbers == sorted(numbers)
    assert trigger.reads_as == "triggerer"
    assert trigger.lag is None
    assert trigger.millis_behind_latest is not None
    assert trigger.last_poll_at is not None
    assert (trigger.records, trigger.events) == (7, 7)


async def test_a_restarted_watcher_reads_on_after_its_stored_positions(
    kinesis_stream: MakeStream, moto_server: str
) -> None:
    stream = await kinesis_stream(shards=1)
    await send(uri(stream, moto_server), [json.dumps({"order": n}) for n in range(5)])
    first = await take(KinesisTrigger(stream=stream, endpoint_url=moto_server), 5)
    # Read again without stored positions: the same records, under the same dedup keys.
    again = await take(KinesisTrigger(stream=stream, endpoint_url=moto_server), 5)
    assert [e.dedup_key for e in again] == [e.dedup_key for e in first]

    assert first[2].checkpoint is not None
    key, position = first[2].checkpoint
    with stored({key: position, f"kinesis/{stream}/other/shardId-000000000000": "1"}):
        rest = await take(KinesisTrigger(stream=stream, endpoint_url=moto_server), 2)
    assert [e.payload["body"]["order"] for e in rest] == [3, 4]


async def test_start_latest_reads_only_what_comes_after_the_first_start(
    kinesis_stream: MakeStream, moto_server: str
) -> None:
    stream = await kinesis_stream(shards=1)
    await send(uri(stream, moto_server), [json.dumps({"order": 0})])
    trigger = KinesisTrigger(
        stream=stream, endpoint_url=moto_server, start="LATEST", poll_interval_s=0.1
    )
    async with running(trigger) as events, anyio.create_task_group() as group:

        async def later() -> None:
            await anyio.sleep(1)  # the trigger has its iterator by then
            await send(uri(stream, moto_server), [json.dumps({"order": 1})])

        group.start_soon(later)
        with anyio.fail_after(20):
            event = await anext(events)
    assert event.payload["body"] == {"order": 1}


async def test_filter_apply_function_and_partition_key(
    kinesis_stream: MakeStream, moto_server: str
) -> None:
    stream = await kinesis_stream()
    bodies = [
        {"kind": "a", "order": 1},
        {"kind": "b", "order": 2},
        {"kind": "a", "order": 3, "drop": True},
        {"kind": "a", "order": 4},
    ]
    await send(uri(stream, moto_server), [json.dumps(body) for body in bodies])
    trigger = KinesisTrigger(
        stream=stream,
        endpoint_url=moto_server,
        filter={"path": "$.body.kind", "equals": "a"},
        apply_function=f"{__name__}.only_kind",
        partition_key_path="$.order",
    )
    events = await take(trigger, 2)
    assert [e.payload for e in events] == [{"kind": "a", "order": 1}, {"kind": "a", "order": 4}]
    assert [e.partition_key for e in events] == ["1", "4"]
    assert trigger.filtered == 2


async def test_a_poison_record_is_tried_in_place_then_dead_lettered_and_the_shard_goes_on(
    kinesis_stream: MakeStream, moto_server: str
) -> None:
    stream = await kinesis_stream()
    await send(uri(stream, moto_server), ['"ok-1"', '"poison"', '"ok-2"'])
    reject_poison.calls = 0  # type: ignore[attr-defined]
    trigger = KinesisTrigger(
        stream=stream,
        endpoint_url=moto_server,
        apply_function=f"{__name__}.reject_poison",
        max_deliveries=3,
    )
    ok, letter, after = await take(trigger, 3)
    assert (ok.payload["body"], after.payload["body"]) == ("ok-1", "ok-2")
    assert ok.dead_letter is after.dead_letter is None
    assert letter.dead_letter == "ValueError: poison pill (failed 3 times)"
    assert letter.payload["body"] == "poison"  # the record as read, before apply_function
    assert letter.checkpoint is not None
    assert letter.checkpoint[1] == letter.payload["sequence_number"]
    assert reject_poison.calls == 5  # type: ignore[attr-defined]
    assert (trigger.failed, trigger.dead_lettered) == (3, 1)


async def test_a_missing_stream_is_the_watchers_error_naming_it(moto_server: str) -> None:
    trigger = KinesisTrigger(stream="no-such-stream", endpoint_url=moto_server)
    with pytest.raises(LookupError, match="Kinesis stream 'no-such-stream' does not exist at"):
        await take(trigger, 1)
    with pytest.raises(LookupError, match="'no-such-stream' does not exist"):
        await send(uri("no-such-stream", moto_server), ["x"])


async def test_credentials_region_and_endpoint_from_a_named_connection(
    kinesis_stream: MakeStream, moto_server: str
) -> None:
    stream = await kinesis_stream()
    settings = {
        "aws": {
            "aws_access_key_id": "testing",
            "aws_secret_access_key": "testing",
            "region_name": "us-east-1",
            "endpoint_url": moto_server,
        }
    }
    previous = connections._source
    connections.read_from(lambda: settings)
    try:
        await send(f"kinesis://{stream}", ['"via connection"'], connection="aws")
        [event] = await take(KinesisTrigger(stream=stream, connection="aws"), 1)
    finally:
        connections.read_from(previous)
    assert event.payload["body"] == "via connection"


async def test_send_puts_more_than_one_call_holds_in_order(
    kinesis_stream: MakeStream, moto_server: str
) -> None:
    stream = await kinesis_stream()
    numbers = await send(uri(stream, moto_server), [str(n) for n in range(1200)])
    assert len(numbers) == 1200
    assert [int(n) for n in numbers] == sorted(int(n) for n in numbers)
    events = await take(KinesisTrigger(stream=stream, endpoint_url=moto_server), 1200, 60)
    assert [e.payload["body"] for e in events] == list(range(1200))


async def test_every_shard_is_listed(kinesis_stream: MakeStream, moto_server: str) -> None:
    """One page: moto pages ListShards unlike Kinesis (it wants the stream name again with
    the NextToken, which Kinesis refuses), so paging is tested on the fake client."""
    stream = await kinesis_stream(shards=5)
    client = KinesisClient()
    await client.connect("us-east-1", moto_server, None)
    try:
        reader = ShardReader(
            client,
            stream,
            positions={},
            start="TRIM_HORIZON",
            limit=100,
            idle_s=0.1,
            relist_interval_s=60,
        )
        await reader.list_shards()
    finally:
        await client.aclose()
    assert sorted(reader.shards) == [f"shardId-{n:012d}" for n in range(5)]


async def test_the_watcher_reads_as_a_name_of_its_own_and_rebuilds_from_serialize(
    moto_server: str,
) -> None:
    class Asset:
        name = "orders"
        uri = "s3://lake/orders"

    trigger = KinesisTrigger(stream="orders", endpoint_url=moto_server)
    for_watcher = trigger.for_watcher(Asset(), "orders_stream")
    assert isinstance(for_watcher, KinesisTrigger)
    assert for_watcher.reads_as is not None
    assert for_watcher.reads_as.startswith("triggerer-orders_stream-")
    assert for_watcher.exclusive_sources() == (
        f"Kinesis stream 'orders' read as {for_watcher.reads_as!r}",
    )
    named = KinesisTrigger(stream="orders", application_name="mine")
    assert named.for_watcher(Asset(), "orders_stream") is named
    rebuilt = load_trigger(*for_watcher.serialize())
    assert rebuilt.serialize() == for_watcher.serialize()
