"""Message bytes written with a registered schema: Avro, Protobuf and JSON Schema records in
Confluent's or AWS Glue's wire format, decoded with the writer's schema fetched from the
registry. The queue triggers call :mod:`watchers.schemas.decoding`; the wire formats are
:mod:`watchers.schemas.wire`, the JSON forms of Avro's values :mod:`watchers.schemas.json_forms`,
the decoders :mod:`watchers.schemas.decoders` and the registries' clients
:mod:`watchers.schemas.registries`."""
