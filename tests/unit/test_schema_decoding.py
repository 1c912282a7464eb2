"""The wire formats of schema registries, the JSON forms of decoded records and the decoders
made from writers' schemas: pure logic, no registry (:mod:`watchers.schemas`)."""

from __future__ import annotations

import datetime
import decimal
import json
import math
import uuid
from typing import Any

import pytest
from google.protobuf import descriptor_pb2

from tests.fixtures.schema_registry import avro_record, confluent, glue, proto_class
from triggerer.triggers import UnusableTrigger, load_trigger
from watchers import MessageQueueTrigger, PubSubTrigger, RabbitMqTrigger
from watchers.kafka import KafkaTrigger
from watchers.schemas import wire
from watchers.schemas.decoders import CorruptRecord, SchemaRejected, WriterSchema, decoder_of
from watchers.schemas.decoding import BodyFormat
from watchers.schemas.json_forms import json_form, needs_conversion

# -- wire formats


def test_a_confluent_frame_gives_its_schema_id_and_record() -> None:
    schema_id, record = wire.confluent_frame(b"\x00\x00\x01\x00\x07body")
    assert (schema_id, bytes(record)) == (65543, b"body")


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b"", "0 bytes, fewer than the 5"),
        (b"\x00\x00\x01", "3 bytes"),
        (b'{"id": 1}', "the first byte is 123, not the magic byte 0"),
        (b"\x01\x00\x00\x00\x01x", "the first byte is 1"),
    ],
)
def test_what_is_not_confluent_wire_format_says_why(raw: bytes, says: str) -> None:
    with pytest.raises(wire.NotWireFormat, match=says):
        wire.confluent_frame(raw)


@pytest.mark.parametrize("indexes", [(0,), (1,), (0, 2), (3, 0, 1), (200, 70000)])
def test_protobuf_message_indexes_are_read_back(indexes: tuple[int, ...]) -> None:
    _, record = wire.confluent_frame(confluent(1, b"message", indexes))
    assert wire.message_indexes(record) == (indexes, memoryview(b"message"))


@pytest.mark.parametrize(
    ("record", "says"),
    [
        (b"", "ends in a varint"),
        (b"\x04\x02", "ends in a varint"),  # a count of 2, one index
        (b"\x03", "a count of -2"),
        (b"\x02\x01", "a negative index -1"),
        (b"\xff" * 11, "over 64 bits"),
        (b"\xd0\x01", "a count of 104"),
    ],
)
def test_corrupt_message_indexes_say_why(record: bytes, says: str) -> None:
    with pytest.raises(wire.NotWireFormat, match=says):
        wire.message_indexes(memoryview(record))


@pytest.mark.parametrize("compressed", [False, True])
def test_a_glue_frame_gives_its_version_id_and_record(compressed: bool) -> None:
    version = str(uuid.uuid4())
    assert wire.glue_frame(glue(version, b"record", compressed=compressed)) == (version, b"record")


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b"\x03\x00" + bytes(10), "12 bytes, fewer than the 18"),
        (b"\x00" * 20, "the first byte is 0, not the header version 3"),
        (b"\x03\x07" + bytes(16) + b"x", "unknown compression byte 7"),
        (b"\x03\x05" + bytes(16) + b"not zlib", "corrupt zlib-compressed record"),
    ],
)
def test_what_is_not_glue_wire_format_says_why(raw: bytes, says: str) -> None:
    with pytest.raises(wire.NotWireFormat, match=says):
        wire.glue_frame(raw)


# -- JSON forms


@pytest.mark.parametrize(
    ("value", "form"),
    [
        (b"\x00\xff", "AP8="),
        (decimal.Decimal("1E+3"), "1000"),
        (decimal.Decimal("-0.050"), "-0.050"),
        (datetime.date(2024, 2, 29), "2024-02-29"),
        (datetime.time(13, 14, 15, 120000), "13:14:15.120000"),
        (datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=datetime.UTC), "2024-05-06T07:08:09Z"),
        (
            datetime.datetime(
                2024, 5, 6, 9, 8, 9, 5, tzinfo=datetime.timezone(datetime.timedelta(hours=2))
            ),
            "2024-05-06T07:08:09.000005Z",
        ),
        (datetime.datetime(2024, 5, 6, 7, 8, 9), "2024-05-06T07:08:09"),  # noqa: DTZ001 - local-timestamp
        (uuid.UUID(int=1), "00000000-0000-0000-0000-000000000001"),
        (math.nan, "NaN"),
        (math.inf, "Infinity"),
        (-math.inf, "-Infinity"),
        (1.5, 1.5),
        ({"a": [b"\x01", None, True, 2]}, {"a": ["AQ==", None, True, 2]}),
    ],
)
def test_decoded_values_take_their_json_forms(value: Any, form: Any) -> None:
    assert json_form(value) == form


def test_a_value_without_a_json_form_is_named() -> None:
    with pytest.raises(TypeError, match="type set has no JSON form"):
        json_form({1, 2})


@pytest.mark.parametrize(
    ("schema", "needs"),
    [
        ({"type": "record", "name": "R", "fields": [{"name": "a", "type": "string"}]}, False),
        ({"type": "array", "items": "long"}, False),
        ({"type": "map", "values": "double"}, True),
        (["null", "bytes"], True),
        ({"type": "int", "logicalType": "date"}, True),
        ({"type": "fixed", "name": "F", "size": 2}, True),
    ],
)
def test_schemas_whose_records_are_json_already_skip_the_conversion(
    schema: Any, needs: bool
) -> None:
    assert needs_conversion(schema) is needs


# -- decoders

ORDER: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "amount", "type": "double"},
        {"name": "address", "type": "shop.Address"},
    ],
}
ADDRESS: dict[str, Any] = {
    "type": "record",
    "name": "Address",
    "namespace": "shop",
    "fields": [{"name": "city", "type": "string"}],
}
WITH_ADDRESS = WriterSchema(
    "AVRO",
    json.dumps(ORDER),
    (("shop.Address", WriterSchema("AVRO", json.dumps(ADDRESS))),),
)


def test_an_avro_record_decodes_with_the_schemas_it_refers_to() -> None:
    decode = decoder_of(WITH_ADDRESS)
    full = {**ORDER, "fields": [*ORDER["fields"][:2], {"name": "address", "type": ADDRESS}]}
    record = avro_record(full, {"id": 1, "amount": math.nan, "address": {"city": "Oslo"}})
    assert decode(record) == {"id": 1, "amount": "NaN", "address": {"city": "Oslo"}}


@pytest.mark.parametrize(
    ("cut", "says"),
    [
        (lambda r: r[:-1], "EOFError: Expected 4 bytes, read 3"),
        (lambda r: r[:1], "EOFError"),
        (lambda r: r + b"\x00", "1 bytes left"),
    ],
)
def test_a_corrupt_avro_record_says_why(cut: Any, says: str) -> None:
    schema = {"type": "record", "name": "R", "fields": [{"name": "s", "type": "string"}]}
    decode = decoder_of(WriterSchema("AVRO", json.dumps(schema)))
    with pytest.raises(CorruptRecord, match=says):
        decode(cut(avro_record(schema, {"s": "text"})))


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        (WriterSchema("AVRO", "{not json"), "not JSON"),
        (WriterSchema("AVRO", json.dumps({"type": "enum", "name": "E"})), "fastavro refuses"),
        (WriterSchema("AVRO", json.dumps(ORDER)), "fastavro refuses"),  # its reference missing
        (WriterSchema("JSON", json.dumps({"type": 12})), "jsonschema refuses"),
        (WriterSchema("PROTOBUF", "message M {}"), "serialized FileDescriptorProto"),
        (WriterSchema("PROTOBUF", b"\xff\xff"), "not a serialized FileDescriptorProto"),
        (WriterSchema("XML", "<a/>"), "schema type 'XML' is none of AVRO, PROTOBUF, JSON"),
    ],
)
def test_a_schema_the_library_refuses_says_why(schema: WriterSchema, says: str) -> None:
    with pytest.raises(SchemaRejected, match=says):
        decoder_of(schema)


def test_a_json_schema_record_is_validated() -> None:
    item = {"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"]}
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {"items": {"type": "array", "items": {"$ref": "item.json"}}},
    }
    decode = decoder_of(
        WriterSchema(
            "JSON", json.dumps(schema), (("item.json", WriterSchema("JSON", json.dumps(item))),)
        )
    )
    assert decode(b'{"items": [{"sku": "a"}]}') == {"items": [{"sku": "a"}]}
    with pytest.raises(CorruptRecord, match=r"at \$.items\[0\]: 'sku' is a required property"):
        decode(b'{"items": [{}]}')
    with pytest.raises(CorruptRecord, match="not JSON"):
        decode(b"{")


def _proto_file() -> descriptor_pb2.FileDescriptorProto:
    """``shop.proto``: ``Order`` (with a nested ``Line`` and an enum) and ``Refund``."""
    file = descriptor_pb2.FileDescriptorProto(name="shop.proto", package="shop", syntax="proto3")
    file.dependency.append("google/protobuf/timestamp.proto")
    field = descriptor_pb2.FieldDescriptorProto
    order = file.message_type.add(name="Order")
    order.field.add(name="id", number=1, type=field.TYPE_INT64, label=field.LABEL_OPTIONAL)
    order.field.add(
        name="state",
        number=2,
        type=field.TYPE_ENUM,
        type_name=".shop.Order.State",
        label=field.LABEL_OPTIONAL,
    )
    order.field.add(
        name="lines",
        number=3,
        type=field.TYPE_MESSAGE,
        type_name=".shop.Order.Line",
        label=field.LABEL_REPEATED,
    )
    order.field.add(
        name="at",
        number=4,
        type=field.TYPE_MESSAGE,
        type_name=".google.protobuf.Timestamp",
        label=field.LABEL_OPTIONAL,
    )
    order.enum_type.add(name="State").value.add(name="NEW", number=0)
    order.enum_type[0].value.add(name="PAID", number=1)
    line = order.nested_type.add(name="Line")
    line.field.add(name="sku", number=1, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    refund = file.message_type.add(name="Refund")
    refund.field.add(name="ok", number=1, type=field.TYPE_BOOL, label=field.LABEL_OPTIONAL)
    return file


def test_protobuf_records_decode_by_their_message_indexes() -> None:
    file = _proto_file()
    decode = decoder_of(WriterSchema("PROTOBUF", file.SerializeToString()))
    order_class = proto_class(file, "Order")
    order = order_class(id=-(2**40), state=1)
    order.lines.add(sku="a")
    order.at.FromSeconds(0)
    _, first = wire.confluent_frame(confluent(1, order.SerializeToString(), (0,)))
    assert decode(first) == {
        "id": str(-(2**40)),
        "state": "PAID",
        "lines": [{"sku": "a"}],
        "at": "1970-01-01T00:00:00Z",
    }
    line = order_class.Line(sku="b").SerializeToString()
    assert decode(bytes(wire.confluent_frame(confluent(1, line, (0, 0)))[1])) == {"sku": "b"}
    assert decode(b"\x02\x02") == {"ok": False}  # indexes (1,): Refund, empty
    with pytest.raises(CorruptRecord, match=r"indexes \[5\] name no message of 'shop.proto'"):
        decode(b"\x02\x0a")
    with pytest.raises(CorruptRecord, match="corrupt Protobuf message"):
        decode(b"\x00\x0a\xff")


def test_a_protobuf_schema_decodes_with_the_files_it_imports() -> None:
    common = descriptor_pb2.FileDescriptorProto(name="money.proto", package="m", syntax="proto3")
    field = descriptor_pb2.FieldDescriptorProto
    money = common.message_type.add(name="Money")
    money.field.add(name="cents", number=1, type=field.TYPE_INT32, label=field.LABEL_OPTIONAL)
    main = descriptor_pb2.FileDescriptorProto(name="pay.proto", package="p", syntax="proto3")
    main.dependency.append("money.proto")
    pay = main.message_type.add(name="Pay")
    pay.field.add(
        name="price",
        number=1,
        type=field.TYPE_MESSAGE,
        type_name=".m.Money",
        label=field.LABEL_OPTIONAL,
    )
    # The registry's serialized reference may carry another file name: the import's counts.
    served = descriptor_pb2.FileDescriptorProto()
    served.CopyFrom(common)
    served.name = "elsewhere.proto"
    schema = WriterSchema(
        "PROTOBUF",
        main.SerializeToString(),
        (("money.proto", WriterSchema("PROTOBUF", served.SerializeToString())),),
    )
    pay_class = proto_class(main, "Pay", [common])
    record = pay_class(price={"cents": 250}).SerializeToString()
    assert decoder_of(schema)(b"\x00" + record) == {"price": {"cents": 250}}


# -- options


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"value_format": "xml"}, "value_format='xml' must be one of json, avro, protobuf"),
        ({"value_format": "avro"}, "value_format='avro' needs schema_registry"),
        ({"key_format": "protobuf"}, "key_format='protobuf' needs schema_registry"),
        ({"value_format": "avro", "schema_registry": " "}, "schema_registry=' ' must be"),
    ],
)
def test_format_options_are_checked_when_the_trigger_is_made(
    options: dict[str, Any], says: str
) -> None:
    with pytest.raises(ValueError, match=says):
        KafkaTrigger(bootstrap_servers="localhost:9092", topics=["t"], **options)


def test_format_options_are_serialized_only_when_given() -> None:
    plain = KafkaTrigger(bootstrap_servers="localhost:9092", topics=["t"])
    assert not {"value_format", "key_format", "schema_registry"} & set(plain.serialize()[1])
    avro = KafkaTrigger(
        bootstrap_servers="localhost:9092",
        topics=["t"],
        value_format="avro",
        schema_registry="http://registry:8081",
    )
    kwargs = avro.serialize()[1]
    assert (kwargs["value_format"], kwargs["schema_registry"]) == ("avro", "http://registry:8081")
    assert "key_format" not in kwargs


@pytest.mark.parametrize(
    "uri", ["pubsub://my-project/orders", "amqp://broker/%2F/orders"], ids=["pubsub", "rabbitmq"]
)
def test_the_shared_reader_triggers_take_the_format_options(uri: str) -> None:
    plain = MessageQueueTrigger(uri)
    assert isinstance(plain, PubSubTrigger | RabbitMqTrigger)
    # A trigger stored before the options came keeps its key.
    assert not {"value_format", "schema_registry"} & set(plain.serialize()[1])
    avro = MessageQueueTrigger(uri, value_format="avro", schema_registry="http://registry:8081")
    assert isinstance(avro, PubSubTrigger | RabbitMqTrigger)
    kwargs = avro.serialize()[1]
    assert (kwargs["value_format"], kwargs["schema_registry"]) == ("avro", "http://registry:8081")
    assert load_trigger(*avro.serialize()).serialize() == avro.serialize()
    assert avro.reader_key != plain.reader_key  # a reader of its own on the shared source
    for options, says in [
        ({"value_format": "avro"}, "value_format='avro' needs schema_registry"),
        ({"value_format": "xml"}, "value_format='xml' must be one of json, avro"),
    ]:
        unusable = MessageQueueTrigger(uri, **options)
        assert isinstance(unusable, UnusableTrigger)
        assert says in unusable.serialize()[1]["error"]


async def test_json_needs_no_registry_and_no_bytes_decode_to_none() -> None:
    plain = BodyFormat()
    assert (await plain.decode(b'{"a": 1}')).value == {"a": 1}
    assert await BodyFormat("avro", "http://127.0.0.1:9").decode(None) == (None, None)
