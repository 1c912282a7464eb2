"""The registry of queue providers: a URI scheme to the provider that reads it.

Built-in providers are named by ``"module:attribute"`` strings and imported on first use, so a
Kafka URI does not import the AWS client. The daemon imports them all at start, for their
:class:`~triggerer.providers.SharedReaders`: a provider whose client is an optional extra
imports it only once a trigger or a sender needs it (:func:`watchers.clients.require`).
Others come from the entry-point group ``triggerer.queue_providers`` (name: the scheme; value:
a :class:`triggerer.providers.Provider`, or a plain callable ``(uri, **options) ->
BaseEventTrigger``).
"""

from __future__ import annotations

import importlib
import importlib.metadata

import structlog

from triggerer.providers import Provider

log = structlog.get_logger(__name__)

ENTRY_POINT_GROUP = "triggerer.queue_providers"

BUILT_IN = {
    "kafka": "watchers.kafka:PROVIDER",
    "sqs": "watchers.sqs:PROVIDER",
    "https": "watchers.sqs:PROVIDER",  # an SQS queue URL
    "http": "watchers.sqs:PROVIDER",  # an SQS queue URL on a local endpoint
    "amqp": "watchers.rabbitmq:PROVIDER",
    "amqps": "watchers.rabbitmq:PROVIDER",  # AMQP over TLS
    "kinesis": "watchers.kinesis:PROVIDER",
    "pubsub": "watchers.pubsub:PROVIDER",
    "nats": "watchers.nats:PROVIDER",
    "redis+stream": "watchers.redis.streams:PROVIDER",
    "redis+pubsub": "watchers.redis.pubsub:PROVIDER",
    "mqtt": "watchers.mqtt:PROVIDER",
    "mqtts": "watchers.mqtt:PROVIDER",  # MQTT over TLS
}


def for_scheme(scheme: str) -> Provider | None:
    """The provider of URIs of ``scheme`` (lower case), ``None`` when none is installed."""
    if scheme in BUILT_IN:
        return _built_in(BUILT_IN[scheme])
    entry_point = _entry_points().get(scheme)
    return None if entry_point is None else _loaded(scheme, entry_point)


def schemes() -> list[str]:
    """Every scheme a provider reads, sorted."""
    return sorted({*BUILT_IN, *_entry_points()})


def installed() -> list[Provider]:
    """Every installed provider, once each (built-in ones first). One that cannot be loaded is
    logged and left out: the watchers of its scheme fail, naming it; the others run."""
    found: dict[str, Provider] = {}
    for reference in BUILT_IN.values():
        provider = _built_in(reference)
        found.setdefault(provider.name, provider)
    for scheme, entry_point in _entry_points().items():
        try:
            provider = _loaded(scheme, entry_point)
        except (ValueError, TypeError) as error:
            log.error("queue_provider_unusable", scheme=scheme, error=str(error))
            continue
        found.setdefault(provider.name, provider)
    return list(found.values())


def _built_in(reference: str) -> Provider:
    module, _, attribute = reference.partition(":")
    provider: Provider = getattr(importlib.import_module(module), attribute)
    return provider


def _loaded(scheme: str, entry_point: importlib.metadata.EntryPoint) -> Provider:
    """The provider of ``entry_point``; a ``ValueError`` naming it when its import fails."""
    try:
        loaded = entry_point.load()
    # A third party's module runs on import: whatever it raises is that provider's error.
    except Exception as error:
        raise ValueError(
            f"queue provider {scheme!r} ({ENTRY_POINT_GROUP} entry point {entry_point.value}) "
            f"cannot be loaded: {type(error).__name__}: {error}"
        ) from error
    return _provider(scheme, loaded)


def _provider(scheme: str, loaded: object) -> Provider:
    if isinstance(loaded, Provider):
        return loaded
    if callable(loaded):
        return Provider(name=scheme, schemes=(scheme,), trigger=loaded)
    raise TypeError(
        f"queue provider {scheme!r} of the entry points {ENTRY_POINT_GROUP!r} is {loaded!r}, "
        "neither a triggerer.providers.Provider nor a callable (uri, **options) -> trigger"
    )


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {
        entry_point.name.lower(): entry_point
        for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    }
