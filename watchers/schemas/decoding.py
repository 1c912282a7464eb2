"""The one place the queue triggers decode a message's bytes: as JSON (``value_format="json"``,
the default), or with the writer's schema from a schema registry (``"avro"``, ``"protobuf"``,
``"json_schema"``).

:class:`BodyFormat` is a trigger's format option and its ``schema_registry`` (a Confluent REST
URL, or the name of a connection holding one, or AWS Glue's settings), checked when the trigger
is made. ``await body_format.decode(raw)`` gives the :class:`Decoded` record and its schema id,
or raises:

- :class:`Undecodable`: the message cannot be decoded (not the registry's wire format, an id
  the registry does not hold, a corrupt record, a schema the library refuses, any other error
  of the library on the record or its schema, named): the trigger makes it a dead letter with
  the reason, and goes on;
- :class:`~watchers.schemas.registries.RegistryUnavailable` once the registry has not answered
  a few tries in a row, or :class:`~watchers.schemas.registries.RegistryRefused`: the message is
  not acknowledged and the error fails the watcher, which the daemon restarts with backoff
  (``watchers list`` shows it), so the message is read again once the registry answers.

Schemas are fetched once per daemon (and event loop) for each registry and schema id, and
shared: triggers asking for a schema being fetched wait for that fetch.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import weakref
from typing import Any, NamedTuple

import anyio
import structlog

from triggerer.backoff import Backoff
from triggerer.connections import get_connection
from watchers.clients import check_settings
from watchers.payloads import decode_body
from watchers.schemas import wire
from watchers.schemas.decoders import (
    AVRO,
    JSON,
    PROTOBUF,
    CorruptRecord,
    Decoder,
    SchemaRejected,
    decoder_of,
)
from watchers.schemas.registries import (
    ConfluentRegistry,
    GlueRegistry,
    Registry,
    RegistryUnavailable,
    SchemaNotFound,
)

log = structlog.get_logger(__name__)

VALUE_FORMATS = ("json", "avro", "protobuf", "json_schema")
_SCHEMA_TYPES = {"avro": AVRO, "protobuf": PROTOBUF, "json_schema": JSON}
#: Tries of an unanswering registry within one message before its watcher fails (the daemon
#: then restarts it with its own, longer backoff).
TRIES_IN_PLACE = 3
BACKOFF_IN_PLACE_MAX_S = 1.0
#: Records from this size on are decoded in a worker thread, not on the event loop.
THREAD_FROM_BYTES = 256 * 1024

_CONFLUENT_KEYS = frozenset({"type", "url", "username", "password", "token", "ssl_cafile"})
_GLUE_KEYS = frozenset(
    {
        "type",
        "region_name",
        "endpoint_url",
        "aws_access_key_id",
        "aws_secret_access_key",
        "aws_session_token",
    }
)


class Undecodable(ValueError):
    """A message its format cannot decode: a dead letter. ``body`` is its bytes as
    ``value_format="json"`` gives them (base64 for a binary record), for the dead letter's
    payload."""

    def __init__(self, reason: str, raw: bytes) -> None:
        super().__init__(reason)
        self.raw = raw

    @property
    def body(self) -> Any:
        return decode_body(self.raw)


class Decoded(NamedTuple):
    """A message's decoded bytes, and the id of the schema they were written with (``None``
    for JSON)."""

    value: Any
    schema_id: int | str | None = None


@dataclasses.dataclass(frozen=True)
class BodyFormat:
    """How a trigger decodes message bytes; ``option`` names the format option in messages
    (``key_format`` for Kafka keys)."""

    value_format: str = "json"
    schema_registry: str | None = None
    option: str = "value_format"

    def __post_init__(self) -> None:
        if self.value_format not in VALUE_FORMATS:
            raise ValueError(
                f"{self.option}={self.value_format!r} must be one of {', '.join(VALUE_FORMATS)}"
            )
        if self.schema_registry is not None and not (
            isinstance(self.schema_registry, str) and self.schema_registry.strip()
        ):
            raise ValueError(
                f"schema_registry={self.schema_registry!r} must be a registry's URL "
                "(http://host:8081) or the name of a connection"
            )
        if self.value_format != "json" and self.schema_registry is None:
            raise ValueError(
                f"{self.option}={self.value_format!r} needs schema_registry: a registry's URL "
                "(http://host:8081) or the name of a connection holding its settings"
            )

    @property
    def plain(self) -> bool:
        """JSON: no registry, no schema."""
        return self.value_format == "json"

    def load(self) -> None:
        """Read the registry's settings now (its connection): an unknown connection or setting
        is a ``ValueError`` (or ``UnknownConnection``), the watcher's error, not each
        message's."""
        if not self.plain:
            self._schemas  # noqa: B018 - the cached lookup is the point

    async def decode(self, raw: bytes | None) -> Decoded:
        """``raw`` decoded: see the module's docstring for what it raises. No bytes (a Kafka
        record without a key, a tombstone) decode to ``None``."""
        if raw is None or self.plain:
            return Decoded(decode_body(raw))
        schemas = self._schemas
        schema_id: int | str
        record: bytes | memoryview
        try:
            if schemas.glue:
                schema_id, record = wire.glue_frame(raw)
            else:
                schema_id, record = wire.confluent_frame(raw)
            # The schema is fetched once: every later record finds its decoder here.
            decoder = schemas.decoders.get((schema_id, _SCHEMA_TYPES[self.value_format]))
            if decoder is None:
                decoder = await self._decoder(schemas, schema_id)
            elif isinstance(decoder, SchemaRejected):
                raise decoder
            value = await _decoded(decoder, record)
        except (wire.NotWireFormat, CorruptRecord, SchemaRejected, SchemaNotFound) as error:
            raise Undecodable(f"{self.option}={self.value_format!r}: {error}", raw) from None
        return Decoded(value, schema_id)

    async def _decoder(self, schemas: _Schemas, schema_id: int | str) -> Decoder:
        backoff = Backoff(max_s=BACKOFF_IN_PLACE_MAX_S)
        while True:
            try:
                return await schemas.decoder(schema_id, _SCHEMA_TYPES[self.value_format])
            except RegistryUnavailable as error:
                if backoff.attempt + 1 >= TRIES_IN_PLACE:
                    raise
                log.warning("schema_registry_retry", schema_id=schema_id, error=str(error))
                await backoff.wait()

    @functools.cached_property
    def _schemas(self) -> _Schemas:
        assert self.schema_registry is not None  # noqa: S101 - checked in __post_init__
        return schemas_of(self.schema_registry)


async def _decoded(decoder: Decoder, record: bytes | memoryview) -> Any:
    """``record`` decoded, in a worker thread when large; a :class:`CorruptRecord` for any
    error of the decoding library, which its decoder did not turn into one (a value out of
    the range its JSON form allows, a ``$ref`` of the schema nothing provides, nesting too deep
    for it): decoding the same bytes again would fail again."""
    try:
        if len(record) < THREAD_FROM_BYTES:
            return decoder(record)
        return await anyio.to_thread.run_sync(decoder, record)
    except CorruptRecord:
        raise
    # What a library raises on a record is not all known (nor kept the same across versions);
    # whatever it is, the message is a dead letter, not the watcher's error read again forever.
    except Exception as error:  # noqa: BLE001
        raise CorruptRecord(f"{type(error).__name__}: {error}") from None


class _Schemas:
    """The decoders of one registry's schemas, by schema id and expected type, each fetched
    once; concurrent asks for one schema share its fetch."""

    def __init__(self, registry: Registry, *, glue: bool) -> None:
        self.registry = registry
        self.glue = glue
        #: The decoder of each schema fetched (by id and expected type), or why it has none.
        self.decoders: dict[tuple[int | str, str], Decoder | SchemaRejected] = {}
        self._fetches: dict[tuple[int | str, str], asyncio.Task[Decoder | SchemaRejected]] = {}

    async def decoder(self, schema_id: int | str, schema_type: str) -> Decoder:
        key = (schema_id, schema_type)
        found = self.decoders.get(key)
        if found is None:
            fetch = self._fetches.get(key)
            if fetch is None:
                fetch = asyncio.create_task(self._fetch(schema_id, schema_type))
                self._fetches[key] = fetch
                fetch.add_done_callback(functools.partial(self._fetched, key))
            # Shielded: a trigger cancelled while waiting leaves the fetch to the others.
            found = await asyncio.shield(fetch)
        if isinstance(found, SchemaRejected):
            raise found
        return found

    async def _fetch(self, schema_id: int | str, schema_type: str) -> Decoder | SchemaRejected:
        schema = await self.registry.fetch(schema_id, schema_type=schema_type)
        log.info(
            "schema_fetched",
            registry=self.registry.name,
            schema_id=schema_id,
            schema_type=schema.schema_type,
        )
        result: Decoder | SchemaRejected
        if schema.schema_type != schema_type:
            result = SchemaRejected(
                f"schema {schema_id} of {self.registry.name} is {schema.schema_type}, not "
                f"{schema_type}"
            )
        else:
            try:
                result = decoder_of(schema)
            except SchemaRejected as rejected:
                result = SchemaRejected(f"schema {schema_id}: {rejected}")
            # A library's error decoder_of does not turn into a verdict (a schema nested too
            # deep for it): as much a verdict on the schema, kept like one, not the watcher's
            # error met again at each restart.
            except Exception as error:  # noqa: BLE001
                result = SchemaRejected(
                    f"schema {schema_id}: the library refuses it: {type(error).__name__}: {error}"
                )
        # A registry never changes the schema of an id: the decoder, or why there is none,
        # holds for the daemon's life.
        self.decoders[schema_id, schema_type] = result
        return result

    def _fetched(
        self, key: tuple[int | str, str], fetch: asyncio.Task[Decoder | SchemaRejected]
    ) -> None:
        self._fetches.pop(key, None)
        if not fetch.cancelled():
            fetch.exception()  # retrieved here too: its waiters may all have been cancelled


_SCHEMAS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _Schemas]] = (
    weakref.WeakKeyDictionary()
)


def schemas_of(schema_registry: str) -> _Schemas:
    """The schemas of the registry ``schema_registry`` names, shared by every trigger of this
    event loop that names it with the same settings."""
    registry, glue, identity = _registry(schema_registry)
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return _Schemas(registry, glue=glue)  # not in a loop: a check, nothing to share
    per_loop = _SCHEMAS.setdefault(loop, {})
    schemas = per_loop.get(identity)
    if schemas is None:
        schemas = per_loop[identity] = _Schemas(registry, glue=glue)
    return schemas


def _registry(schema_registry: str) -> tuple[Registry, bool, str]:
    """The registry ``schema_registry`` names, whether it is Glue, and its identity (what
    tells it from another)."""
    if schema_registry.startswith(("http://", "https://")):
        return ConfluentRegistry(schema_registry), False, json.dumps([schema_registry])
    settings = get_connection(schema_registry)
    identity = json.dumps([schema_registry, settings], sort_keys=True, default=str)
    kind = settings.get("type", "confluent")
    if kind == "glue":
        check_settings(schema_registry, settings, _GLUE_KEYS, "schema_registry (AWS Glue)")
        options = {key: value for key, value in settings.items() if key != "type"}
        return GlueRegistry(options), True, identity
    if kind != "confluent":
        raise ValueError(
            f"connection {schema_registry!r} has type={kind!r}; a schema registry's is "
            "'confluent' (the default) or 'glue'"
        )
    check_settings(schema_registry, settings, _CONFLUENT_KEYS, "schema_registry")
    url = settings.get("url")
    if not (isinstance(url, str) and url.startswith(("http://", "https://"))):
        raise ValueError(
            f"connection {schema_registry!r} must hold the registry's url (http://host:8081), "
            f"not {url!r}"
        )
    registry = ConfluentRegistry(
        url,
        username=settings.get("username"),
        password=settings.get("password"),
        token=settings.get("token"),
        ssl_cafile=settings.get("ssl_cafile"),
    )
    return registry, False, identity
