"""A writer's schema, as a registry gives it, made into the decoder of its records: Avro with
fastavro, Protobuf with the protobuf runtime, JSON Schema with jsonschema. CPU work, no I/O.

A decoder takes a record's bytes (after the registry's framing) and gives its JSON form (Avro:
:mod:`watchers.schemas.json_forms`; Protobuf: the canonical ProtoJSON mapping; JSON Schema: the
JSON itself, validated), or raises :class:`CorruptRecord` saying what is wrong. A schema the
library refuses is a :class:`SchemaRejected`.

The libraries are imported when a schema of their kind is first made into a decoder: a daemon
that decodes none of them loads none of them.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import io
import json
from collections.abc import Callable, Iterator
from typing import Any

import msgspec

from watchers.schemas.json_forms import json_form, needs_conversion
from watchers.schemas.wire import message_indexes

Decoder = Callable[[memoryview | bytes], Any]

AVRO = "AVRO"
PROTOBUF = "PROTOBUF"
JSON = "JSON"
SCHEMA_TYPES = (AVRO, PROTOBUF, JSON)

#: Protobuf files every schema may import without naming them as references (the registry
#: knows them too), from the protobuf runtime's own modules.
_WELL_KNOWN_PROTOS = (
    "any",
    "api",
    "duration",
    "empty",
    "field_mask",
    "source_context",
    "struct",
    "timestamp",
    "type",
    "wrappers",
    "descriptor",
)
_JSON = msgspec.json.Decoder()


class CorruptRecord(ValueError):
    """A record its writer's schema cannot decode; the message says why."""


class SchemaRejected(ValueError):
    """A schema the decoding library refuses; the message says why."""


@dataclasses.dataclass(frozen=True)
class WriterSchema:
    """A schema as a registry holds it: its type (``AVRO``, ``PROTOBUF``, ``JSON``), its text
    (for Protobuf, the serialized ``FileDescriptorProto``) and the schemas it refers to, by the
    name it refers to each (an Avro type's full name, a ``.proto`` import, a JSON Schema
    ``$ref``)."""

    schema_type: str
    schema: str | bytes
    references: tuple[tuple[str, WriterSchema], ...] = ()

    def referenced(self) -> Iterator[tuple[str, WriterSchema]]:
        """Every schema this one refers to, directly or not, each before those referring to it,
        each once."""
        seen: set[str] = set()

        def walk(schema: WriterSchema) -> Iterator[tuple[str, WriterSchema]]:
            for name, reference in schema.references:
                if name not in seen:
                    seen.add(name)
                    yield from walk(reference)
                    yield name, reference

        return walk(self)


def decoder_of(schema: WriterSchema) -> Decoder:
    """The decoder of records written with ``schema``; a :class:`SchemaRejected` when the
    library refuses it."""
    makers = {AVRO: _avro_decoder, PROTOBUF: _protobuf_decoder, JSON: _json_schema_decoder}
    maker = makers.get(schema.schema_type)
    if maker is None:
        raise SchemaRejected(
            f"schema type {schema.schema_type!r} is none of {', '.join(SCHEMA_TYPES)}"
        )
    return maker(schema)


# -- Avro


def _avro_decoder(schema: WriterSchema) -> Decoder:
    fastavro = importlib.import_module("fastavro")
    named: dict[str, Any] = {}
    documents = []
    try:
        for _, reference in schema.referenced():
            documents.append(_json_document(reference))
            fastavro.parse_schema(documents[-1], named_schemas=named)
        documents.append(_json_document(schema))
        parsed = fastavro.parse_schema(documents[-1], named_schemas=named)
    # Besides its own errors, fastavro's parser meets a schema missing a key it needs
    # (KeyError) or holding a value of the wrong kind (TypeError, AttributeError, ValueError).
    except (
        fastavro.schema.SchemaParseException,
        fastavro.schema.UnknownType,
        KeyError,
        TypeError,
        AttributeError,
        ValueError,
    ) as error:
        raise SchemaRejected(f"fastavro refuses the Avro schema: {_described(error)}") from None
    # fastavro's compiled reader recurses on the C stack, unchecked: a record of a type that
    # holds itself, nested a few thousand levels (or of a type holding itself with no way to
    # end), would crash the daemon, again at each restart. Such types are read by its Python
    # reader, whose depth Python bounds (a RecursionError).
    if _recursive(named):
        read = importlib.import_module("fastavro._read_py").schemaless_reader
    else:
        read = fastavro.schemaless_reader
    convert = needs_conversion(documents)

    def decode(record: memoryview | bytes) -> Any:
        buffer = io.BytesIO(record)
        try:
            value = read(buffer, parsed, None)
        # What fastavro's reader raises on bytes its schema does not describe: a record cut
        # short (EOFError), an enum or union index out of range (IndexError), text that is not
        # UTF-8 or a date out of range (ValueError, OverflowError).
        except (EOFError, IndexError, KeyError, ValueError, OverflowError) as error:
            raise CorruptRecord(f"corrupt Avro record: {_described(error)}") from None
        except RecursionError:
            raise CorruptRecord(
                "Avro record nested deeper than its reader goes (about 150 levels of a type "
                "that holds itself)"
            ) from None
        extra = len(record) - buffer.tell()
        if extra:
            raise CorruptRecord(f"corrupt Avro record: {extra} bytes left after the record")
        if not convert:
            return value
        try:
            return json_form(value)
        except TypeError as error:
            raise CorruptRecord(f"Avro record without a JSON form: {error}") from None

    return decode


_NAMED_AVRO_TYPES = frozenset({"record", "error", "enum", "fixed"})


def _recursive(named: dict[str, Any]) -> bool:
    """Whether one of the named types of a parsed Avro schema (fastavro's ``named_schemas``)
    holds itself, directly or through others."""
    refers = {name: _named_in(definition) for name, definition in named.items()}
    for name, direct in refers.items():
        seen: set[str] = set()
        todo = list(direct)
        while todo:
            other = todo.pop()
            if other == name:
                return True
            if other not in seen:
                seen.add(other)
                todo.extend(refers.get(other, ()))
    return False


def _named_in(definition: dict[str, Any]) -> set[str]:
    """The names a named type's parsed definition refers to (its fields' types, by name or
    defined in place, whose own definitions are not looked into: they are among the named
    types too)."""
    found: set[str] = set()
    todo: list[Any] = [field.get("type") for field in definition.get("fields", ())]
    while todo:
        schema = todo.pop()
        if isinstance(schema, str):
            found.add(schema)
        elif isinstance(schema, list):
            todo.extend(schema)
        elif isinstance(schema, dict):
            kind = schema.get("type")
            if kind in _NAMED_AVRO_TYPES and "name" in schema:
                found.add(schema["name"])
            elif kind == "array":
                todo.append(schema.get("items"))
            elif kind == "map":
                todo.append(schema.get("values"))
            else:
                todo.append(kind)  # a logical type's, or a type in {"type": ...}
    return found


# -- Protobuf


def _protobuf_decoder(schema: WriterSchema) -> Decoder:
    descriptor_pool = importlib.import_module("google.protobuf.descriptor_pool")
    json_format = importlib.import_module("google.protobuf.json_format")
    message_factory = importlib.import_module("google.protobuf.message_factory")
    decode_error = importlib.import_module("google.protobuf.message").DecodeError
    pool = descriptor_pool.DescriptorPool()
    try:
        for name, reference in schema.referenced():
            pool.AddSerializedFile(_with_well_known(pool, reference, name))
        file = pool.AddSerializedFile(_with_well_known(pool, schema))
    except (TypeError, ValueError) as error:  # the upb runtime's errors for a bad descriptor
        raise SchemaRejected(f"protobuf refuses the schema's descriptor: {error}") from None
    if not file.message_types_by_name:
        raise SchemaRejected(f"the Protobuf schema {file.name!r} defines no message")

    @functools.cache
    def message_class(indexes: tuple[int, ...]) -> Any:
        try:
            descriptor = list(file.message_types_by_name.values())[indexes[0]]
            for index in indexes[1:]:
                descriptor = descriptor.nested_types[index]
        except IndexError:
            raise CorruptRecord(
                f"Protobuf message indexes {list(indexes)} name no message of {file.name!r}"
            ) from None
        return message_factory.GetMessageClass(descriptor)

    def decode(record: memoryview | bytes) -> Any:
        indexes, body = message_indexes(memoryview(record))
        try:
            message = message_class(indexes).FromString(bytes(body))
        except decode_error as error:
            raise CorruptRecord(f"corrupt Protobuf message: {error}") from None
        try:
            return json_format.MessageToDict(
                message,
                always_print_fields_with_no_presence=True,
                preserving_proto_field_name=True,
                descriptor_pool=pool,
            )
        # A value without a JSON form: a Timestamp or Duration out of ProtoJSON's range.
        except json_format.Error as error:
            raise CorruptRecord(f"Protobuf message without a JSON form: {error}") from None

    return decode


def _with_well_known(pool: Any, schema: WriterSchema, name: str | None = None) -> bytes:
    """The schema's serialized descriptor, named ``name`` (a reference: the name it is imported
    by) when given, after adding to ``pool`` each well-known file it imports (a file a
    reference gave is in the pool already)."""
    descriptor_pb2 = importlib.import_module("google.protobuf.descriptor_pb2")
    if not isinstance(schema.schema, bytes):
        raise SchemaRejected("a Protobuf schema must come as a serialized FileDescriptorProto")
    try:
        proto = descriptor_pb2.FileDescriptorProto.FromString(schema.schema)
    except Exception as error:  # noqa: BLE001 - the runtime's DecodeError, or worse, on garbage
        raise SchemaRejected(f"not a serialized FileDescriptorProto: {error}") from None
    for dependency in proto.dependency:
        if dependency.startswith("google/protobuf/"):
            _add_well_known(pool, dependency)
    if name is None or proto.name == name:
        return bytes(schema.schema)
    proto.name = name
    return bytes(proto.SerializeToString())


def _add_well_known(pool: Any, name: str) -> None:
    try:
        pool.FindFileByName(name)
    except KeyError:
        pass
    else:
        return
    stem = name.removeprefix("google/protobuf/").removesuffix(".proto")
    if stem not in _WELL_KNOWN_PROTOS:
        raise SchemaRejected(f"the Protobuf schema imports {name!r}, which no reference gives")
    module = importlib.import_module(f"google.protobuf.{stem}_pb2")
    descriptor_pb2 = importlib.import_module("google.protobuf.descriptor_pb2")
    proto = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(proto)
    for dependency in proto.dependency:
        _add_well_known(pool, dependency)
    pool.AddSerializedFile(proto.SerializeToString())


# -- JSON Schema


def _json_schema_decoder(schema: WriterSchema) -> Decoder:
    jsonschema = importlib.import_module("jsonschema")
    referencing = importlib.import_module("referencing")
    document = _json_document(schema)
    try:
        validator_class = jsonschema.validators.validator_for(document)
        validator_class.check_schema(document)
        # A referenced schema without ``$schema`` is of the referring schema's draft.
        draft = referencing.jsonschema.specification_with(validator_class.META_SCHEMA["$schema"])
        resources = [
            (name, draft.create_resource(_json_document(reference)))
            for name, reference in schema.referenced()
        ]
    except (
        jsonschema.exceptions.SchemaError,
        referencing.exceptions.CannotDetermineSpecification,
    ) as error:
        raise SchemaRejected(f"jsonschema refuses the JSON schema: {_first_line(error)}") from None
    validator = validator_class(document, registry=referencing.Registry().with_resources(resources))
    best_match = jsonschema.exceptions.best_match

    def decode(record: memoryview | bytes) -> Any:
        try:
            value = _JSON.decode(record)
        except msgspec.DecodeError as error:
            raise CorruptRecord(f"not JSON: {error}") from None
        except RecursionError:
            raise CorruptRecord(
                "JSON nested too deeply to read (over about 1,000 levels)"
            ) from None
        try:
            problem = best_match(validator.iter_errors(value))
        # A $ref the record leads validation to, which neither the schema nor its references
        # hold (nothing is fetched from elsewhere).
        except referencing.exceptions.Unresolvable as error:
            raise CorruptRecord(
                f"the JSON schema refers to what none of its references holds: {error}"
            ) from None
        if problem is not None:
            raise CorruptRecord(
                f"the JSON does not match its schema at {problem.json_path}: {problem.message}"
            )
        return value

    return decode


def _json_document(schema: WriterSchema) -> Any:
    """The parsed JSON text of an Avro or JSON Schema ``schema``."""
    try:
        return json.loads(schema.schema)
    except (TypeError, ValueError) as error:
        raise SchemaRejected(f"the {schema.schema_type} schema is not JSON: {error}") from None


def _described(error: Exception) -> str:
    text = str(error)
    if isinstance(error, EOFError) and not text:
        text = "the record ends before its last field"
    return f"{type(error).__name__}: {text}"


def _first_line(error: Exception) -> str:
    return str(error).split("\n", 1)[0]
