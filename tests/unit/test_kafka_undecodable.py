"""What KafkaTrigger makes of a record whose decoding fails: a dead letter, the partition going
on, but for a registry that cannot serve the schema now, which fails the watcher (the record is
read again once it is back). Pure: the records are made here, no broker."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from aiokafka import ConsumerRecord

from watchers import cloudevents
from watchers.cloudevents import Binding
from watchers.kafka import KafkaTrigger
from watchers.schemas.decoding import BodyFormat, Decoded
from watchers.schemas.registries import RegistryRefused, RegistryUnavailable

DEEP = b"[" * 5000 + b"]" * 5000
"""JSON nested deeper than msgspec goes: it raises a RecursionError, not a DecodeError."""
STRUCTURED = [("content-type", b"application/cloudevents+json")]


def record(
    value: bytes, headers: list[tuple[str, bytes]] | None = None
) -> ConsumerRecord[Any, Any]:
    return ConsumerRecord(
        "orders", 0, 7, 1_790_000_000_000, 0, None, value, None, 0, 0, headers or []
    )


def trigger(**options: Any) -> KafkaTrigger:
    return KafkaTrigger(bootstrap_servers="kafka.invalid:9092", topics=["orders"], **options)


async def test_json_nested_too_deep_is_text_or_a_malformed_cloudevent() -> None:
    plain = trigger()
    event = await plain._handle(record(DEEP), None)  # no reader, so no ack
    assert event is not None
    assert (event.dead_letter, event.payload["value"]) == (None, DEEP.decode())
    letter = await plain._handle(
        record(b'{"specversion": "1.0", "data": ' + DEEP + b"}", STRUCTURED), None
    )
    assert letter is not None
    assert (
        letter.dead_letter
        == "CloudEvent in JSON format is JSON nested too deeply to read (over about 1,000 levels)"
    )
    assert (plain.events, plain.undecodable) == (1, 1)


@dataclasses.dataclass(frozen=True)
class Broken(Binding):
    """A binding with a bug: an error none of the decoding steps names."""

    def recognise(self, *args: Any, **kwargs: Any) -> Any:
        raise ZeroDivisionError("division by zero")


async def test_any_other_error_of_decoding_is_a_dead_letter_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cloudevents, "KAFKA", Broken("Kafka"))
    plain = trigger()
    letter = await plain._handle(record(b'{"order": 7}'), None)
    assert letter is not None
    assert letter.dead_letter == "ZeroDivisionError: division by zero"
    assert letter.payload["value"] == {"order": 7}


@pytest.mark.parametrize(
    "error", [RegistryUnavailable("registry down"), RegistryRefused("registry refuses")]
)
async def test_a_registry_that_cannot_serve_the_schema_fails_the_watcher(
    monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    async def decode(self: BodyFormat, raw: bytes | None) -> Decoded:
        raise error

    monkeypatch.setattr(BodyFormat, "decode", decode)
    avro = trigger(value_format="avro", schema_registry="http://registry.invalid:8081")
    with pytest.raises(type(error)):
        await avro._handle(record(b"\x00\x00\x00\x00\x01\x02"), None)
    assert avro.undecodable == 0
