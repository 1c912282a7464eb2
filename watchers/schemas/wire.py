"""The framing producers put around a record encoded with a registered schema: Confluent's wire
format and AWS Glue Schema Registry's. Pure parsing, no I/O.

Confluent: byte 0 is the magic byte 0, bytes 1-4 the schema id (a big-endian unsigned 32-bit
integer), the rest the record; a Protobuf record starts with its message indexes (which message
of the schema's file it is). Glue: byte 0 is the header version 3, byte 1 the compression (0
none, 5 zlib), bytes 2-17 the schema version id (a UUID), the rest the record, compressed when
byte 1 says so.
"""

from __future__ import annotations

import uuid
import zlib

CONFLUENT_MAGIC = 0
CONFLUENT_HEADER_BYTES = 5
GLUE_HEADER_VERSION = 3
GLUE_UNCOMPRESSED = 0
GLUE_ZLIB = 5
GLUE_HEADER_BYTES = 18
#: Message indexes are a path into nested message types: deeper than this is not a real schema.
MAX_MESSAGE_INDEXES = 100
#: A Glue record decompressed to more than this is refused: zlib expands up to about 1,000
#: times, so a message of a few megabytes could take the daemon's memory (a record this large
#: would not fit a broker's message uncompressed either).
MAX_DECOMPRESSED_BYTES = 64 * 1024 * 1024


class NotWireFormat(ValueError):
    """The bytes are not framed as the registry's wire format says, or their framing is
    corrupt; the message names what is wrong."""


def confluent_frame(raw: bytes) -> tuple[int, memoryview]:
    """The schema id and the record of a message in Confluent's wire format."""
    if len(raw) < CONFLUENT_HEADER_BYTES:
        raise NotWireFormat(
            f"not Confluent wire format: {len(raw)} bytes, fewer than the "
            f"{CONFLUENT_HEADER_BYTES} of its header (magic byte 0 and a 4-byte schema id)"
        )
    if raw[0] != CONFLUENT_MAGIC:
        raise NotWireFormat(
            f"not Confluent wire format: the first byte is {raw[0]}, not the magic byte 0"
        )
    return int.from_bytes(raw[1:CONFLUENT_HEADER_BYTES], "big"), memoryview(raw)[5:]


def message_indexes(record: memoryview) -> tuple[tuple[int, ...], memoryview]:
    """The message indexes at the start of a Confluent Protobuf record, and the message after
    them. They are zig-zag varints: a count, then that many indexes; a count of 0 stands for
    ``(0,)``, the first message of the file."""
    count, position = _zigzag_varint(record, 0)
    if count == 0:
        return (0,), record[position:]
    if not 0 < count <= MAX_MESSAGE_INDEXES:
        raise NotWireFormat(
            f"corrupt Protobuf message indexes: a count of {count} "
            f"(from 1 to {MAX_MESSAGE_INDEXES} expected)"
        )
    indexes = []
    for _ in range(count):
        index, position = _zigzag_varint(record, position)
        if index < 0:
            raise NotWireFormat(f"corrupt Protobuf message indexes: a negative index {index}")
        indexes.append(index)
    return tuple(indexes), record[position:]


def glue_frame(raw: bytes) -> tuple[str, bytes]:
    """The schema version id (a UUID as text) and the record, decompressed, of a message in
    AWS Glue Schema Registry's wire format."""
    if len(raw) < GLUE_HEADER_BYTES:
        raise NotWireFormat(
            f"not AWS Glue Schema Registry wire format: {len(raw)} bytes, fewer than the "
            f"{GLUE_HEADER_BYTES} of its header"
        )
    if raw[0] != GLUE_HEADER_VERSION:
        raise NotWireFormat(
            f"not AWS Glue Schema Registry wire format: the first byte is {raw[0]}, not the "
            f"header version {GLUE_HEADER_VERSION}"
        )
    version_id = str(uuid.UUID(bytes=bytes(raw[2:GLUE_HEADER_BYTES])))
    record = raw[GLUE_HEADER_BYTES:]
    if raw[1] == GLUE_UNCOMPRESSED:
        return version_id, record
    if raw[1] == GLUE_ZLIB:
        inflate = zlib.decompressobj()
        try:
            decompressed = inflate.decompress(record, MAX_DECOMPRESSED_BYTES)
        except zlib.error as error:
            raise NotWireFormat(f"corrupt zlib-compressed record: {error}") from None
        if inflate.unconsumed_tail:
            raise NotWireFormat(
                f"zlib-compressed record of over {MAX_DECOMPRESSED_BYTES // 2**20} MiB decompressed"
            )
        if not inflate.eof:
            raise NotWireFormat("corrupt zlib-compressed record: it ends before its stream")
        return version_id, decompressed
    raise NotWireFormat(
        f"AWS Glue Schema Registry wire format with an unknown compression byte {raw[1]} "
        f"({GLUE_UNCOMPRESSED}: none, {GLUE_ZLIB}: zlib)"
    )


def _zigzag_varint(data: memoryview, position: int) -> tuple[int, int]:
    """The zig-zag varint at ``position`` and the position after it."""
    result = shift = 0
    while True:
        if position >= len(data):
            raise NotWireFormat("corrupt Protobuf message indexes: the record ends in a varint")
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), position
        shift += 7
        if shift > 63:
            raise NotWireFormat("corrupt Protobuf message indexes: a varint of over 64 bits")
