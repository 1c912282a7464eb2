"""The Kinesis shard reader's logic on a fake client that answers as the Kinesis API documents
(moto cannot show these: its iterators never expire, its shards never close, it never
throttles, and it pages ListShards otherwise): resharding, expired iterators, throttling,
paging, where each shard starts. Also the ``kinesis://`` URI and the trigger's options."""

from __future__ import annotations

import dataclasses
from typing import Any

import anyio
import pytest
from botocore.exceptions import ClientError

from watchers.kinesis import PROVIDER, KinesisTrigger, parse_kinesis_uri
from watchers.kinesis.reader import ShardReader
from watchers.queue import MessageQueueTrigger


@dataclasses.dataclass
class FakeShard:
    records: list[str]  # sequence numbers, ascending
    parents: tuple[str, ...] = ()
    children: tuple[str, ...] = ()
    closed: bool = False


def _error(code: str, operation: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code}}, operation)


class FakeKinesis:
    """Kinesis as documented: ListShards pages (NextToken without the stream name), a closed
    shard's last GetRecords has no NextShardIterator and names its ChildShards."""

    def __init__(self, shards: dict[str, FakeShard], page_size: int = 2) -> None:
        self.shards = shards
        self.page_size = page_size
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.expire: set[str] = set()  # shards whose next GetRecords meets an expired iterator
        self.throttle: dict[str, int] = {}  # shard -> GetRecords calls to throttle

    async def call(self, operation: str, **arguments: Any) -> dict[str, Any]:
        self.calls.append((operation, arguments))
        answer: dict[str, Any] = getattr(self, operation)(**arguments)
        return answer

    def list_shards(self, **arguments: Any) -> dict[str, Any]:
        if "NextToken" in arguments:
            assert "StreamName" not in arguments, "Kinesis refuses both"
            first = int(arguments["NextToken"])
        else:
            assert arguments["StreamName"] == "orders"
            first = 0
        names = sorted(self.shards)
        page = names[first : first + self.page_size]
        answer: dict[str, Any] = {
            "Shards": [
                {
                    "ShardId": name,
                    **dict(
                        zip(
                            ("ParentShardId", "AdjacentParentShardId"),
                            self.shards[name].parents,
                            strict=False,
                        )
                    ),
                    "SequenceNumberRange": (
                        {"StartingSequenceNumber": "0", "EndingSequenceNumber": "999"}
                        if self.shards[name].closed
                        else {"StartingSequenceNumber": "0"}
                    ),
                }
                for name in page
            ]
        }
        if first + self.page_size < len(names):
            answer["NextToken"] = str(first + self.page_size)
        return answer

    def get_shard_iterator(self, **arguments: Any) -> dict[str, Any]:
        shard = self.shards[arguments["ShardId"]]
        kind = arguments["ShardIteratorType"]
        if kind == "AFTER_SEQUENCE_NUMBER":
            after = arguments["StartingSequenceNumber"]
            index = sum(1 for number in shard.records if int(number) <= int(after))
        elif kind == "TRIM_HORIZON":
            index = 0
        elif kind == "AT_TIMESTAMP":  # here a record arrived at its number, in milliseconds
            at_ms = arguments["Timestamp"].timestamp() * 1000
            index = sum(1 for number in shard.records if int(number) < at_ms)
        else:
            assert kind == "LATEST"
            index = len(shard.records)
        return {"ShardIterator": f"{arguments['ShardId']}:{index}"}

    def get_records(self, ShardIterator: str, Limit: int) -> dict[str, Any]:
        shard_id, index_text = ShardIterator.split(":")
        if shard_id in self.expire:
            self.expire.discard(shard_id)
            raise _error("ExpiredIteratorException", "GetRecords")
        if self.throttle.get(shard_id, 0) > 0:
            self.throttle[shard_id] -= 1
            raise _error("ProvisionedThroughputExceededException", "GetRecords")
        shard = self.shards[shard_id]
        index = int(index_text)
        numbers = shard.records[index : index + Limit]
        answer: dict[str, Any] = {
            "Records": [{"SequenceNumber": number, "Data": b"x"} for number in numbers],
            "MillisBehindLatest": 0,
        }
        end = index + len(numbers)
        if shard.closed and end == len(shard.records):
            answer["ChildShards"] = [
                {"ShardId": child, "ParentShards": list(self.shards[child].parents)}
                for child in shard.children
            ]
        else:
            answer["NextShardIterator"] = f"{shard_id}:{end}"
        return answer


def reader(
    fake: FakeKinesis,
    positions: dict[str, str] | None = None,
    start: str = "TRIM_HORIZON",
    started_at_ms: int | None = None,
) -> ShardReader:
    return ShardReader(
        fake,
        "orders",
        positions=positions or {},
        start=start,
        limit=2,
        idle_s=0.01,
        relist_interval_s=3600,
        started_at_ms=started_at_ms,
        list_page_size=2,
    )


async def read(shard_reader: ShardReader, count: int) -> list[tuple[str, str]]:
    """The first ``count`` records read, as ``(shard, sequence number)``."""
    read: list[tuple[str, str]] = []
    with anyio.fail_after(10):
        async for shard_id, records in shard_reader.records():
            read += [(shard_id, record["SequenceNumber"]) for record in records]
            if len(read) >= count:
                return read
    raise AssertionError("unreachable")


def S(n: int) -> str:
    return f"shardId-{n:012d}"


async def test_a_split_shard_is_read_to_its_end_before_its_children() -> None:
    fake = FakeKinesis(
        {
            S(0): FakeShard(["1", "2", "3"], children=(S(1), S(2)), closed=True),
            S(1): FakeShard(["10", "11"], parents=(S(0),)),
            S(2): FakeShard(["20"], parents=(S(0),)),
        }
    )
    got = await read(reader(fake), 6)
    assert got[:3] == [(S(0), "1"), (S(0), "2"), (S(0), "3")]
    assert sorted(got[3:]) == [(S(1), "10"), (S(1), "11"), (S(2), "20")]


async def test_a_merged_shard_waits_for_both_parents() -> None:
    fake = FakeKinesis(
        {
            S(0): FakeShard(["1"], children=(S(2),), closed=True),
            S(1): FakeShard(["5", "6", "7", "8", "9"], children=(S(2),), closed=True),
            S(2): FakeShard(["30"], parents=(S(0), S(1))),
        }
    )
    got = await read(reader(fake), 7)
    assert got[-1] == (S(2), "30")
    assert sorted(got[:-1]) == sorted([(S(0), "1")] + [(S(1), n) for n in "56789"])


async def test_an_expired_iterator_is_replaced_after_the_last_record_read() -> None:
    fake = FakeKinesis({S(0): FakeShard(["1", "2", "3", "4", "5"])})
    shard_reader = reader(fake)
    first = await read(shard_reader, 2)
    fake.expire.add(S(0))
    rest = await read(shard_reader, 3)
    assert [n for _, n in first + rest] == ["1", "2", "3", "4", "5"]
    iterators = [
        arguments for operation, arguments in fake.calls if operation == "get_shard_iterator"
    ]
    assert iterators[-1]["ShardIteratorType"] == "AFTER_SEQUENCE_NUMBER"
    assert iterators[-1]["StartingSequenceNumber"] == "2"


async def test_a_throttled_shard_backs_off_while_the_others_are_read() -> None:
    fake = FakeKinesis({S(0): FakeShard(["1", "2"]), S(1): FakeShard(["10", "11", "12", "13"])})
    fake.throttle[S(0)] = 2
    got = await read(reader(fake), 6)
    assert sorted(got) == sorted(
        [(S(0), "1"), (S(0), "2")] + [(S(1), n) for n in ("10", "11", "12", "13")]
    )
    # Shard 1 was read before shard 0 answered.
    assert got[0][0] == S(1)


async def test_every_page_of_shards_is_listed_without_the_stream_name_after_the_first() -> None:
    fake = FakeKinesis({S(n): FakeShard([]) for n in range(5)}, page_size=2)
    shard_reader = reader(fake)
    await shard_reader.list_shards()
    assert sorted(shard_reader.shards) == [S(n) for n in range(5)]
    assert [operation for operation, _ in fake.calls] == ["list_shards"] * 3


async def test_stored_positions_read_on_after_them_and_new_shards_from_their_start() -> None:
    fake = FakeKinesis({S(0): FakeShard(["1", "2", "3"]), S(1): FakeShard(["7", "8"])})
    got = await read(reader(fake, {S(0): "2"}, start="LATEST"), 3)
    # Shard 1 has no stored position although others do: it is read from its start.
    assert sorted(got) == [(S(0), "3"), (S(1), "7"), (S(1), "8")]


async def test_latest_on_a_first_start_skips_what_is_there_and_closed_shards() -> None:
    fake = FakeKinesis(
        {
            S(0): FakeShard(["1"], children=(S(1),), closed=True),
            S(1): FakeShard(["5"], parents=(S(0),)),
        }
    )
    shard_reader = reader(fake, start="LATEST")
    await shard_reader.list_shards()
    assert shard_reader.shards[S(0)].finished
    assert [shard.shard_id for shard in shard_reader.readable()] == [S(1)]
    child = shard_reader.shards[S(1)]
    assert await shard_reader.read(child) == []
    fake.shards[S(1)].records.append("6")
    assert [record["SequenceNumber"] for record in await shard_reader.read(child)] == ["6"]


async def test_latest_later_reads_a_shard_without_position_from_the_first_start() -> None:
    """Shard 1 had no record since the first start (at 5 ms): what came to it while the reader
    was stopped is read, what was there before the first start is not."""
    fake = FakeKinesis(
        {S(0): FakeShard(["1", "2", "6", "7"]), S(1): FakeShard(["3", "4", "8", "9"])}
    )
    got = await read(reader(fake, {S(0): "6"}, start="LATEST", started_at_ms=5), 3)
    assert sorted(got) == [(S(0), "7"), (S(1), "8"), (S(1), "9")]
    iterators = {
        arguments["ShardId"]: arguments
        for operation, arguments in fake.calls
        if operation == "get_shard_iterator"
    }
    assert iterators[S(1)]["ShardIteratorType"] == "AT_TIMESTAMP"
    assert iterators[S(1)]["Timestamp"].timestamp() == 0.005


async def test_latest_with_no_position_but_a_first_start_reads_what_came_after_it() -> None:
    """A quiet stream (or one whose every record was filtered out before a position was
    stored): a restart reads what came while the reader was stopped, not from LATEST again."""
    fake = FakeKinesis(
        {
            S(0): FakeShard(["1", "6"], children=(S(1),), closed=True),
            S(1): FakeShard(["7"], parents=(S(0),)),
        }
    )
    got = await read(reader(fake, start="LATEST", started_at_ms=5), 2)
    assert got == [(S(0), "6"), (S(1), "7")]


async def test_trim_horizon_reads_a_shard_without_position_from_its_start_whenever() -> None:
    fake = FakeKinesis({S(0): FakeShard(["1", "6"])})
    got = await read(reader(fake, start="TRIM_HORIZON", started_at_ms=5), 2)
    assert got == [(S(0), "1"), (S(0), "6")]


async def answers(shard_reader: ShardReader, count: int) -> list[tuple[str, str | None]]:
    """The first ``count`` of what the reader yields: ``(shard, sequence number)`` of each
    record, ``(shard, None)`` at the end of a shard."""
    got: list[tuple[str, str | None]] = []
    with anyio.fail_after(10):
        async for shard_id, records in shard_reader.records():
            got += [(shard_id, record["SequenceNumber"]) for record in records] or [
                (shard_id, None)
            ]
            if len(got) >= count:
                return got
    raise AssertionError("unreachable")


async def test_a_reader_reads_only_the_shards_it_holds() -> None:
    fake = FakeKinesis({S(0): FakeShard(["1", "2"]), S(1): FakeShard(["10", "11", "12"])})
    shard_reader = reader(fake)
    await shard_reader.list_shards()
    shard_reader.share({S(0)}, {}, ())
    assert await read(shard_reader, 2) == [(S(0), "1"), (S(0), "2")]
    # Shard 1 is newly held: read on from its position as stored now (another reader's).
    shard_reader.share({S(1)}, {S(1): "10"}, ())
    assert await read(shard_reader, 2) == [(S(1), "11"), (S(1), "12")]


async def test_a_shard_lost_then_held_again_reads_on_from_its_stored_position() -> None:
    """What it read before losing it may not have been stored (its events fenced off)."""
    fake = FakeKinesis({S(0): FakeShard(["1", "2", "3"])})
    shard_reader = reader(fake)
    await shard_reader.list_shards()
    shard_reader.share({S(0)}, {}, ())
    assert await read(shard_reader, 3) == [(S(0), "1"), (S(0), "2"), (S(0), "3")]
    shard_reader.share(set(), {}, ())
    shard_reader.share({S(0)}, {S(0): "1"}, ())
    assert await read(shard_reader, 2) == [(S(0), "2"), (S(0), "3")]


async def test_latest_a_shard_taken_later_without_position_reads_from_the_first_start() -> None:
    """Its last reader read records of it that were never stored (killed before the commit):
    LATEST from the moment it is taken would skip them; the first start (5 ms) does not."""
    fake = FakeKinesis({S(0): FakeShard(["1", "7", "8"])})
    shard_reader = reader(fake, start="LATEST")
    await shard_reader.list_shards()
    shard_reader.share(set(), {}, (), started_at_ms=5)  # another reader holds it
    shard_reader.share({S(0)}, {}, (), started_at_ms=5)
    assert await read(shard_reader, 2) == [(S(0), "7"), (S(0), "8")]


async def test_a_split_shard_read_by_one_reader_gives_its_children_to_any_once_ended() -> None:
    """Reader a holds the parent, b another shard. a reads the parent to its end (and says so:
    the trigger stores that end) and offers the children at once; b offers them only once the
    end is stored, and reads them from their start."""
    shards = {
        S(0): FakeShard(["1", "2"], children=(S(1), S(2)), closed=True),
        S(1): FakeShard(["10"], parents=(S(0),)),
        S(2): FakeShard(["20"], parents=(S(0),)),
        S(3): FakeShard(["30"]),
    }
    a, b = reader(FakeKinesis(shards)), reader(FakeKinesis(shards))
    for one in (a, b):
        await one.list_shards()
        assert one.to_share(()) == [S(0), S(3)]
    a.share({S(0)}, {}, ())
    b.share({S(3)}, {}, ())
    assert await answers(a, 3) == [(S(0), "1"), (S(0), "2"), (S(0), None)]
    # a keeps the parent until its end is stored; b does not know it ended yet.
    assert a.to_share(()) == [S(0), S(1), S(2), S(3)]
    assert b.to_share(()) == [S(0), S(3)]
    assert b.to_share({S(0)}) == [S(1), S(2), S(3)]
    b.share({S(1), S(2), S(3)}, {}, {S(0)})
    assert sorted(await answers(b, 3)) == [(S(1), "10"), (S(2), "20"), (S(3), "30")]


@pytest.mark.parametrize(
    ("uri", "named"),
    [
        ("kinesis://", "must have the form"),
        ("kinesis://orders/extra", "must have the form"),
        ("kinesis://user:secret@orders", "connection="),
        ("kinesis://orders?shard=1", "unknown options ['shard']"),
        ("kinesis://bad*name", "'bad*name'"),
    ],
)
def test_bad_uris_name_the_value(uri: str, named: str) -> None:
    with pytest.raises(ValueError, match="Kinesis") as raised:
        PROVIDER.trigger(uri)
    assert named in str(raised.value)


def test_uri_parts_and_options_that_must_agree() -> None:
    assert parse_kinesis_uri("kinesis://orders?region=eu-west-1&endpoint_url=http://h:1") == (
        "orders",
        "eu-west-1",
        "http://h:1",
    )
    trigger = MessageQueueTrigger("kinesis://orders?region=eu-west-1", start="LATEST")
    assert isinstance(trigger, KinesisTrigger)
    assert (trigger.stream, trigger.region_name, trigger.start) == ("orders", "eu-west-1", "LATEST")
    with pytest.raises(ValueError, match="region_name='eu-west-1' but 'us-east-1'"):
        PROVIDER.trigger("kinesis://orders?region=eu-west-1", region_name="us-east-1")


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"start": "EARLIEST"}, "start='EARLIEST'"),
        ({"max_deliveries": 0}, "max_deliveries=0"),
        ({"limit": 10_001}, "limit=10001"),
        ({"poll_interval_s": 0}, "poll_interval_s=0"),
        ({"application_name": ""}, "application_name=''"),
        ({"filter": {"path": "value"}}, "filter="),
        ({"partition_key_path": "nope"}, "'nope'"),
        ({"apply_function": "nodots"}, "apply_function='nodots'"),
    ],
)
def test_bad_options_name_the_value(options: dict[str, Any], named: str) -> None:
    with pytest.raises(
        ValueError, match=r"KinesisTrigger|filter|JSON path|apply_function"
    ) as raised:
        KinesisTrigger(stream="orders", **options)
    assert named in str(raised.value)
