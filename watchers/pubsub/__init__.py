"""The Google Pub/Sub provider: ``PubSubTrigger``, ``pubsub://`` URIs, ``send`` and the provider
(:mod:`watchers.pubsub.trigger`), the shared puller of a subscription
(:mod:`watchers.pubsub.puller`), its held messages' acks (:mod:`watchers.pubsub.acks`) and its
clients (:mod:`watchers.pubsub.client`)."""

from watchers.pubsub.trigger import PROVIDER, PubSubTrigger, parse_pubsub_uri, send

__all__ = ("PROVIDER", "PubSubTrigger", "parse_pubsub_uri", "send")
