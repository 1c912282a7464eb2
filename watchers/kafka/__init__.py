"""The Kafka provider: ``KafkaTrigger``, ``kafka://`` URIs, ``send`` and the provider
(:mod:`watchers.kafka.trigger`), the consumer a trigger reads through
(:mod:`watchers.kafka.fetcher`), what its own consumer and the shared fetcher both do with
aiokafka (:mod:`watchers.kafka.client`) and topic ids (:mod:`watchers.kafka.metadata`)."""

from watchers.kafka.trigger import PROVIDER, KafkaTrigger, dedup_key, parse_kafka_uri, send

__all__ = ("PROVIDER", "KafkaTrigger", "dedup_key", "parse_kafka_uri", "send")
