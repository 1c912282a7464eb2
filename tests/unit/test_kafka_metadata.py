"""The topics of a Metadata v10 response as :mod:`watchers.kafka.metadata` decodes them by hand:
the same as aiokafka's generic decoding of the whole response, whatever the brokers, partitions
and tagged fields around them hold."""

from __future__ import annotations

import io
import uuid

from aiokafka.protocol.api import Response
from aiokafka.protocol.types import (
    Boolean,
    CompactArray,
    CompactString,
    Int16,
    Int32,
    Schema,
    TaggedFields,
    UnsignedVarInt32,
)

from watchers.kafka.metadata import MetadataResponse_v10, Uuid

TEXT = CompactString("utf-8")


class Tags(TaggedFields):  # type: ignore[misc]  # aiokafka is untyped
    """Tagged fields as the protocol encodes them: count, then tag, size and bytes of each
    (aiokafka's encoder leaves the sizes out; it sends none)."""

    @classmethod
    def encode(cls, value: dict[int, bytes]) -> bytes:
        encoded: bytes = UnsignedVarInt32.encode(len(value))
        for tag, data in sorted(value.items()):
            encoded += UnsignedVarInt32.encode(tag) + UnsignedVarInt32.encode(len(data)) + data
        return encoded


class WholeResponse(Response):  # type: ignore[misc]  # aiokafka is untyped
    """Metadata v10 response as the protocol defines it, every field."""

    API_KEY = 3
    API_VERSION = 10
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "brokers",
            CompactArray(
                ("node_id", Int32),
                ("host", TEXT),
                ("port", Int32),
                ("rack", TEXT),
                ("tags", Tags),
            ),
        ),
        ("cluster_id", TEXT),
        ("controller_id", Int32),
        (
            "topics",
            CompactArray(
                ("error_code", Int16),
                ("name", TEXT),
                ("topic_id", Uuid),
                ("is_internal", Boolean),
                (
                    "partitions",
                    CompactArray(
                        ("error_code", Int16),
                        ("partition_index", Int32),
                        ("leader_id", Int32),
                        ("leader_epoch", Int32),
                        ("replica_nodes", CompactArray(Int32)),
                        ("isr_nodes", CompactArray(Int32)),
                        ("offline_replicas", CompactArray(Int32)),
                        ("tags", Tags),
                    ),
                ),
                ("topic_authorized_operations", Int32),
                ("tags", Tags),
            ),
        ),
        ("cluster_authorized_operations", Int32),
        ("tags", Tags),
    )


def partition(index: int, replicas: list[int], tags: dict[int, bytes]) -> tuple[object, ...]:
    return (0, index, replicas[0], 7, replicas, replicas[:1], [], tags)


def test_the_topics_are_read_past_every_other_field() -> None:
    orders, payments = uuid.uuid4().bytes, uuid.uuid4().bytes
    whole = WholeResponse(
        0,
        [(1, "broker-1", 9092, None, {}), (2, "broker-2", 9093, "rack-b", {0: b"x" * 200})],
        "cluster",
        1,
        [
            (0, "orders", orders, False, [partition(0, [1, 2], {}), partition(1, [2], {})], 0, {}),
            (3, "missing", bytes(16), False, [], -1, {}),
            (0, "pay-ø", payments, False, [partition(0, [1], {5: b"tag", 9: b""})], 0, {1: b"t"}),
            (0, None, bytes(16), True, [], 0, {}),
        ],
        -2147483648,
        {0: b"end"},
    )
    wire = whole.encode()

    decoded = MetadataResponse_v10.decode(io.BytesIO(wire))

    expected = [(code, name, topic_id) for code, name, topic_id, *_ in whole.topics]
    assert decoded.topics == expected
    assert expected[0] == (0, "orders", orders)
    assert MetadataResponse_v10.decode(wire).topics == expected


def test_a_response_without_topics_has_none() -> None:
    wire = WholeResponse(0, [], None, -1, [], 0, {}).encode()

    assert MetadataResponse_v10.decode(wire).topics == []
