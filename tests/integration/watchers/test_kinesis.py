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
import hashlib
import itertools
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from tests.fixtures.triggers import running
from triggerer import checkpoints, connections
from triggerer.triggers import SourceMissing, TriggerEvent, load_trigger
from watchers import KinesisTrigger, MessageQueueTrigger
from watchers.kinesis import send
from watchers.kinesis.reader import KinesisClient, ShardReader

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


async def take(
    trigger: KinesisTrigger, count: int, timeout_s: float = 20, *, checkpoints_only: bool = False
) -> list[TriggerEvent]:
    """The first ``count`` events the trigger yields (or, with ``checkpoints_only``, the first
    ``count`` of what it yields that carry only a checkpoint)."""
    taken: list[TriggerEvent] = []
    with anyio.fail_after(timeout_s):
        async with running(trigger) as events:
            async for event in events:
                if event.is_checkpoint_only == checkpoints_only:
                    taken.append(event)
                if len(taken) == count:
                    break
    return taken


async def next_event(events: AsyncIterator[TriggerEvent]) -> TriggerEvent:
    """The next event, past what carries only a checkpoint."""
    async for event in events:
        if not event.is_checkpoint_only:
            return event
    raise AssertionError("the trigger ended")


async def first_start(trigger: KinesisTrigger) -> tuple[str, str]:
    """The checkpoint of its first start a trigger yields before anything else."""
    async with running(trigger) as events:
        with anyio.fail_after(20):
            marker = await anext(events)
    assert marker.is_checkpoint_only
    assert marker.checkpoint is not None
    return marker.checkpoint


async def put_on(kinesis: Any, stream: str, shard: int, bodies: list[str]) -> list[str]:
    """Put each of ``bodies`` on shard ``shard`` (0 or 1 of two); their sequence numbers."""
    # Kinesis puts a record on the shard whose hash range holds its key's MD5: halves of two.
    key = next(
        key
        for key in map(str, itertools.count())
        if int(hashlib.md5(key.encode(), usedforsecurity=False).hexdigest(), 16) >> 127 == shard
    )
    numbers = []
    for body in bodies:
        answer = await kinesis.put_record(StreamName=stream, Data=body.encode(), PartitionKey=key)
        assert answer["ShardId"] == f"shardId-{shard:012d}"
        numbers.append(answer["SequenceNumber"])
    return numbers


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
            event = await next_event(events)
    assert event.payload["body"] == {"order": 1}


async def test_a_first_start_is_stored_and_a_latest_restart_reads_what_came_while_stopped(
    kinesis_stream: MakeStream, moto_server: str
) -> None:
    """A quiet stream read from LATEST: no event ever moved a position, yet what was put while
    the watcher was stopped is read when it starts again, and nothing from before it first
    started."""
    stream = await kinesis_stream(shards=1)
    await send(uri(stream, moto_server), ['"before"'])
    await anyio.sleep(0.05)
    options: dict[str, Any] = {"endpoint_url": moto_server, "start": "LATEST"}
    before_ms = time.time_ns() // 1_000_000
    key, started_ms = await first_start(KinesisTrigger(stream=stream, **options))
    assert key == f"kinesis/{stream}/triggerer/@started"
    assert before_ms <= int(started_ms) <= time.time_ns() // 1_000_000

    await anyio.sleep(0.05)
    await send(uri(stream, moto_server), ['"while stopped 1"', '"while stopped 2"'])
    with stored({key: started_ms}):
        trigger = KinesisTrigger(stream=stream, poll_interval_s=0.1, **options)
        async with running(trigger) as events:
            with anyio.fail_after(20):
                yielded = [await anext(events), await anext(events)]
    # The first start is stored: not yielded again.
    assert [e.payload["body"] for e in yielded] == ["while stopped 1", "while stopped 2"]


async def test_a_latest_restart_reads_a_shard_without_position_from_the_first_start(
    kinesis_stream: MakeStream, moto_server: str, kinesis: Any
) -> None:
    """Shard 0 has a stored position, shard 1 none (no record came to it before the restart):
    shard 1 is read from the first start, not from its start (TRIM_HORIZON)."""
    stream = await kinesis_stream(shards=2)
    await put_on(kinesis, stream, 0, ['"old 0"'])
    await put_on(kinesis, stream, 1, ['"old 1"'])
    await anyio.sleep(0.05)
    options: dict[str, Any] = {"endpoint_url": moto_server, "start": "LATEST"}
    key, started_ms = await first_start(KinesisTrigger(stream=stream, **options))
    await anyio.sleep(0.05)
    read_0, _ = await put_on(kinesis, stream, 0, ['"new 0a"', '"new 0b"'])
    await put_on(kinesis, stream, 1, ['"new 1"'])

    prefix = key.removesuffix("@started")
    with stored({key: started_ms, f"{prefix}shardId-000000000000": read_0}):
        events = await take(KinesisTrigger(stream=stream, poll_interval_s=0.1, **options), 2)
    assert sorted(e.payload["body"] for e in events) == ["new 0b", "new 1"]


async def test_records_filtered_out_move_the_position_once_per_read(
    kinesis_stream: MakeStream, moto_server: str
) -> None:
    stream = await kinesis_stream(shards=1)
    numbers = await send(
        uri(stream, moto_server), [json.dumps({"kind": "b", "n": n}) for n in range(5)]
    )
    options: dict[str, Any] = {
        "endpoint_url": moto_server,
        "filter": {"path": "$.body.kind", "equals": "a"},
        "poll_interval_s": 0.1,
    }
    # Reads of 2, 2 and 1 records, all filtered out: a checkpoint at the end of each.
    trigger = KinesisTrigger(stream=stream, limit=2, **options)
    marker, *moved = await take(trigger, 4, checkpoints_only=True)
    assert marker.checkpoint is not None
    shard_key = f"kinesis/{stream}/triggerer/shardId-000000000000"
    assert [e.checkpoint for e in moved] == [(shard_key, numbers[n]) for n in (1, 3, 4)]
    assert (trigger.records, trigger.events, trigger.filtered) == (5, 0, 5)

    # Started again after them: the filtered records are not read again.
    more = await send(
        uri(stream, moto_server), [json.dumps({"kind": kind, "n": 5}) for kind in "abb"]
    )
    with stored({marker.checkpoint[0]: marker.checkpoint[1], shard_key: numbers[4]}):
        trigger = KinesisTrigger(stream=stream, **options)
        async with running(trigger) as events:
            with anyio.fail_after(20):
                event, moved_on = await anext(events), await anext(events)
    assert event.payload["body"] == {"kind": "a", "n": 5}
    assert event.checkpoint == (shard_key, more[0])
    # One read, its last records filtered out: one checkpoint past them.
    assert moved_on.is_checkpoint_only
    assert moved_on.checkpoint == (shard_key, more[2])
    assert trigger.records == 3


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
    with pytest.raises(SourceMissing, match="Kinesis stream 'no-such-stream' does not exist at"):
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
