"""Topic ids from a Kafka cluster's metadata: what tells a topic from the one recreated under its
name (KIP-516; Apache Kafka 2.8 and later, tansu).

aiokafka asks for metadata in versions up to 5, which carry no topic id, so this module declares
version 10 of the Metadata request and response (the first flexible version with topic ids) and
sends it on the consumer's own client.
"""

from __future__ import annotations

import struct
import uuid
from typing import TYPE_CHECKING, Any, BinaryIO, ClassVar

from aiokafka.errors import IncompatibleBrokerVersion
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import (
    AbstractType,
    Array,
    Boolean,
    CompactArray,
    CompactString,
    Int16,
    Schema,
    String,
    TaggedFields,
)

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer

METADATA_API_KEY = 3


class Uuid(AbstractType[bytes]):  # type: ignore[misc]  # aiokafka is untyped
    """Kafka's UUID: 16 bytes as they are."""

    @classmethod
    def encode(cls, value: bytes) -> bytes:
        return value

    @classmethod
    def decode(cls, data: BinaryIO) -> bytes:
        return data.read(16)

    @classmethod
    def repr(cls, value: bytes) -> str:
        return str(uuid.UUID(bytes=value))


_TEXT = CompactString("utf-8")


class MetadataResponse_v10(Response):  # type: ignore[misc]  # aiokafka is untyped
    """The topics of a Metadata v10 response: each one's error code, name and id.

    Decoded by hand, skipping the brokers and the partitions: asked every few seconds about
    every topic a consumer reads, aiokafka's generic decoding of the whole response was the
    largest cost an idle daemon added to its consumer's own fetches (1.6 ms for 300 topics of
    a partition each; 0.6 ms so).
    """

    API_KEY = METADATA_API_KEY
    API_VERSION = 10
    SCHEMA = Schema(
        ("topics", Array(("error_code", Int16), ("name", String("utf-8")), ("topic_id", Uuid)))
    )

    @classmethod
    def decode(cls, data: BinaryIO | bytes) -> MetadataResponse_v10:
        body = data if isinstance(data, bytes) else data.read()
        return cls(_topics(body))


def _topics(body: bytes) -> list[tuple[int, str | None, bytes]]:
    """``(error_code, name, topic_id)`` of each topic of a Metadata v10 response body."""
    view = memoryview(body)
    at = 4  # throttle_time_ms
    count, at = _count(view, at)
    for _ in range(count):  # brokers
        at += 4  # node_id
        at = _skip_text(view, at)  # host
        at += 4  # port
        at = _skip_text(view, at)  # rack
        at = _skip_tags(view, at)
    at = _skip_text(view, at)  # cluster_id
    at += 4  # controller_id
    topics = []
    count, at = _count(view, at)
    for _ in range(count):
        (error_code,) = _INT16.unpack_from(view, at)
        length, at = _uvarint(view, at + 2)
        name = None if length == 0 else str(view[at : at + length - 1], "utf-8")
        at += max(length - 1, 0)
        topic_id = bytes(view[at : at + 16])
        at += 17  # the id, is_internal
        partitions, at = _count(view, at)
        for _ in range(partitions):
            at += 14  # error_code, partition_index, leader_id, leader_epoch
            for _ in range(3):  # replica_nodes, isr_nodes, offline_replicas
                nodes, at = _count(view, at)
                at += 4 * nodes
            at = _skip_tags(view, at)
        at += 4  # topic_authorized_operations
        at = _skip_tags(view, at)
        topics.append((error_code, name, topic_id))
    return topics


_INT16 = struct.Struct(">h")


def _uvarint(view: memoryview, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = view[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def _count(view: memoryview, at: int) -> tuple[int, int]:
    """The length of a compact array (0 for null) and where its items start."""
    length, at = _uvarint(view, at)
    return max(length - 1, 0), at


def _skip_text(view: memoryview, at: int) -> int:
    length, at = _uvarint(view, at)
    return at + max(length - 1, 0)


def _skip_tags(view: memoryview, at: int) -> int:
    count, at = _uvarint(view, at)
    for _ in range(count):
        _, at = _uvarint(view, at)
        size, at = _uvarint(view, at)
        at += size
    return at


class MetadataRequest_v10(RequestStruct):  # type: ignore[misc]  # aiokafka is untyped
    FLEXIBLE_VERSION = True
    API_KEY = METADATA_API_KEY
    API_VERSION = 10
    RESPONSE_TYPE = MetadataResponse_v10
    SCHEMA = Schema(
        ("topics", CompactArray(("topic_id", Uuid), ("name", _TEXT), ("tags", TaggedFields))),
        ("allow_auto_topic_creation", Boolean),
        ("include_cluster_authorized_operations", Boolean),
        ("include_topic_authorized_operations", Boolean),
        ("tags", TaggedFields),
    )


class TopicIdsRequest(Request[MetadataRequest_v10]):  # type: ignore[misc]  # aiokafka is untyped
    """The metadata of ``topics`` by name, never creating one."""

    API_KEY: ClassVar[int] = METADATA_API_KEY

    def __init__(self, topics: list[str]) -> None:
        self.topics = topics

    def build(self, request_struct_class: type[MetadataRequest_v10]) -> MetadataRequest_v10:
        unnamed = bytes(16)  # the zero id: the topic is asked for by its name
        topics: list[tuple[bytes, str, dict[int, bytes]]] = [
            (unnamed, topic, {})
            for topic in self.topics  # (id, name, tagged fields)
        ]
        return request_struct_class(topics, False, False, False, {})


async def topic_ids(consumer: AIOKafkaConsumer, topics: set[str]) -> dict[str, bytes] | None:
    """The id of each of ``topics`` that exists now; ``None`` when the brokers have no topic ids.

    Raises aiokafka's errors of a failed request (a broker unreachable meanwhile).
    """
    if not topics:
        return {}
    # The consumer's client: its connections, and the security settings they were made with.
    client: Any = consumer._client  # aiokafka: no public way to send a request
    node = client.get_random_node()
    if node is None:
        return {}  # no broker known yet: asked again at the next look
    try:
        response = await client.send(node, TopicIdsRequest(sorted(topics)))
    except (IncompatibleBrokerVersion, NotImplementedError):
        return None  # Kafka before 2.8: its Metadata request has no version 10
    return {
        name: topic_id
        for error_code, name, topic_id, *_ in response.topics
        if error_code == 0 and topic_id != bytes(16)
    }
