"""The wire formats of schema registries, the JSON forms of decoded records and the decoders
made from writers' schemas, and what a decoding error becomes: pure logic, no registry is asked
(:mod:`watchers.schemas`)."""

from __future__ import annotations

import datetime
import decimal
import json
import math
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from google.protobuf import descriptor_pb2

from tests.fixtures.schema_registry import avro_record, confluent, glue, proto_class
from triggerer.triggers import UnusableTrigger, load_trigger
from watchers import MessageQueueTrigger, PubSubTrigger, RabbitMqTrigger
from watchers.kafka import KafkaTrigger
from watchers.schemas import decoding, wire
from watchers.schemas.decoders import CorruptRecord, SchemaRejected, WriterSchema, decoder_of
from watchers.schemas.decoding import BodyFormat, Undecodable
from watchers.schemas.json_forms import json_form, needs_conversion
from watchers.schemas.registries import ConfluentRegistry, SchemaNotFound

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
        (glue(str(uuid.UUID(int=1)), b"record", compressed=True)[:-2], "ends before its stream"),
    ],
)
def test_what_is_not_glue_wire_format_says_why(raw: bytes, says: str) -> None:
    with pytest.raises(wire.NotWireFormat, match=says):
        wire.glue_frame(raw)


def test_a_glue_record_decompressing_past_its_bound_is_refused() -> None:
    """zlib expands up to about 1,000 times: a message of 100 KB would have taken 100 MB."""
    bomb = glue(str(uuid.UUID(int=1)), bytes(wire.MAX_DECOMPRESSED_BYTES + 1), compressed=True)
    assert len(bomb) < wire.MAX_DECOMPRESSED_BYTES // 500
    with pytest.raises(wire.NotWireFormat, match="record of over 64 MiB decompressed"):
        wire.glue_frame(bomb)
    largest = glue(str(uuid.UUID(int=1)), bytes(wire.MAX_DECOMPRESSED_BYTES), compressed=True)
    assert len(wire.glue_frame(largest)[1]) == wire.MAX_DECOMPRESSED_BYTES


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


NODE = {"type": "record", "name": "Node", "fields": [{"name": "next", "type": ["null", "Node"]}]}
TREE = {  # Tree -> a map of Branch -> an array of Tree
    "type": "record",
    "name": "Tree",
    "fields": [
        {
            "name": "branches",
            "type": {
                "type": "map",
                "values": {
                    "type": "record",
                    "name": "Branch",
                    "fields": [{"name": "trees", "type": {"type": "array", "items": "Tree"}}],
                },
            },
        }
    ],
}


@pytest.mark.parametrize(
    ("schema", "shallow", "value", "deep"),
    [
        (WriterSchema("AVRO", json.dumps(NODE)), b"\x02\x00", {"next": {"next": None}}, None),
        (
            WriterSchema("AVRO", json.dumps(TREE)),
            b"\x02\x02b\x00\x00",  # one branch "b", no trees
            {"branches": {"b": {"trees": []}}},
            b"\x02\x02b\x02" * 50_000,
        ),
        (  # a record holding itself with no way to end: every one is nested without end
            WriterSchema(
                "AVRO",
                json.dumps({"type": "record", "name": "L", "fields": [{"name": "l", "type": "L"}]}),
            ),
            None,
            None,
            b"",
        ),
    ],
    ids=["union", "map-and-array", "endless"],
)
def test_a_record_of_a_type_holding_itself_is_read_to_a_bounded_depth(
    schema: WriterSchema, shallow: bytes | None, value: Any, deep: bytes | None
) -> None:
    """fastavro's compiled reader overflowed the C stack on such a record nested a few
    thousand levels: the process died (a segmentation fault)."""
    decode = decoder_of(schema)
    if shallow is not None:
        assert decode(shallow) == value
    with pytest.raises(CorruptRecord, match="nested deeper than its reader goes"):
        decode(b"\x02" * 100_000 + b"\x00" if deep is None else deep)


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


def test_a_json_schema_record_the_library_cannot_check_is_corrupt() -> None:
    """A ``$ref`` none of the schema's references holds (nothing is fetched from elsewhere),
    met by a record reaching it; JSON nested deeper than the decoder goes."""
    schema = {"type": "object", "properties": {"item": {"$ref": "item.json"}}}
    decode = decoder_of(WriterSchema("JSON", json.dumps(schema)))
    assert decode(b"{}") == {}
    with pytest.raises(CorruptRecord, match="refers to what none of its references holds"):
        decode(b'{"item": {}}')
    with pytest.raises(CorruptRecord, match="nested too deeply"):
        decode(b"[" * 5000 + b"]" * 5000)


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


def test_a_protobuf_value_without_a_json_form_is_corrupt() -> None:
    """A Timestamp the wire holds but ProtoJSON cannot write (after year 9999)."""
    file = _proto_file()
    order = proto_class(file, "Order")(id=1)
    order.at.seconds = 2**62
    decode = decoder_of(WriterSchema("PROTOBUF", file.SerializeToString()))
    with pytest.raises(CorruptRecord, match=r"without a JSON form: .*Timestamp is not valid"):
        decode(b"\x00" + order.SerializeToString())


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


# -- any error of a library on a record or a schema: a dead letter, not the watcher's error


def served(monkeypatch: pytest.MonkeyPatch, schema: WriterSchema) -> tuple[str, list[int | str]]:
    """The URL of a registry of the test's own serving ``schema`` as id 1 (no registry is
    asked: its fetch is replaced), and the ids it is asked for."""
    fetched: list[int | str] = []

    async def fetch(
        self: ConfluentRegistry, schema_id: int | str, *, schema_type: str
    ) -> WriterSchema:
        fetched.append(schema_id)
        if schema_id != 1:
            raise SchemaNotFound(f"schema id {schema_id} is not in the registry")
        return schema

    monkeypatch.setattr(ConfluentRegistry, "fetch", fetch)
    # Decoders are kept per registry URL for the event loop's life: a URL of its own.
    return f"http://registry-{uuid.uuid4().hex}.invalid:8081", fetched


async def test_a_library_error_on_a_record_is_undecodable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    file = _proto_file()
    order = proto_class(file, "Order")(id=1)
    order.at.seconds = 2**62
    url, _ = served(monkeypatch, WriterSchema("PROTOBUF", file.SerializeToString()))
    with pytest.raises(Undecodable, match=r"value_format='protobuf': .*without a JSON form"):
        await BodyFormat("protobuf", url).decode(confluent(1, order.SerializeToString(), (0,)))


async def test_any_error_of_a_decoder_is_undecodable_and_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a library raises that its decoder does not expect (here a bug's ZeroDivisionError,
    in place and in a worker thread for a large record) makes the message a dead letter."""

    def decoder_of_a_bug(schema: WriterSchema) -> Callable[[bytes | memoryview], Any]:
        def decode(record: bytes | memoryview) -> Any:
            return 1 / 0

        return decode

    monkeypatch.setattr(decoding, "decoder_of", decoder_of_a_bug)
    url, _ = served(monkeypatch, WriterSchema("AVRO", '"long"'))
    body_format = BodyFormat("avro", url)
    for record in (b"\x02", b"\x02" * decoding.THREAD_FROM_BYTES):
        with pytest.raises(Undecodable, match="ZeroDivisionError: division by zero") as raised:
            await body_format.decode(confluent(1, record))
        assert raised.value.raw == confluent(1, record)


async def test_a_library_error_on_a_schema_is_undecodable_and_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A schema nested deeper than the library goes (its parser's RecursionError) is refused
    like any schema the library refuses: each message of it a dead letter, fetched once."""
    deep = '"long"'
    for _ in range(2000):
        deep = f'{{"type": "array", "items": {deep}}}'
    url, fetched = served(monkeypatch, WriterSchema("AVRO", deep))
    for _ in range(2):
        with pytest.raises(Undecodable, match="schema 1: the library refuses it: RecursionError"):
            await BodyFormat("avro", url).decode(confluent(1, b"\x00"))
    assert fetched == [1]
