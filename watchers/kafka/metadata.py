"""Topic ids from a Kafka cluster's metadata: what tells a topic from the one recreated under its
name (KIP-516; Apache Kafka 2.8 and later, tansu).

aiokafka asks for metadata in versions up to 5, which carry no topic id, so this module declares
version 10 of the Metadata request and response (the first flexible version with topic ids) and
sends it on the consumer's own client.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any, BinaryIO, ClassVar

from aiokafka.errors import IncompatibleBrokerVersion
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import (
    AbstractType,
    Boolean,
    CompactArray,
    CompactString,
    Int16,
    Int32,
    Schema,
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
    API_KEY = METADATA_API_KEY
    API_VERSION = 10
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "brokers",
            CompactArray(
                ("node_id", Int32),
                ("host", _TEXT),
                ("port", Int32),
                ("rack", _TEXT),
                ("tags", TaggedFields),
            ),
        ),
        ("cluster_id", _TEXT),
        ("controller_id", Int32),
        (
            "topics",
            CompactArray(
                ("error_code", Int16),
                ("name", _TEXT),
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
                        ("tags", TaggedFields),
                    ),
                ),
                ("topic_authorized_operations", Int32),
                ("tags", TaggedFields),
            ),
        ),
        ("cluster_authorized_operations", Int32),
        ("tags", TaggedFields),
    )


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
