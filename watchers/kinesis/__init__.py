"""The Amazon Kinesis provider: ``KinesisTrigger``, ``kinesis://`` URIs, ``send`` and the
provider (:mod:`watchers.kinesis.trigger`), the shards' reader (:mod:`watchers.kinesis.reader`)."""

from watchers.kinesis.trigger import PROVIDER, KinesisTrigger, parse_kinesis_uri, send

__all__ = ("PROVIDER", "KinesisTrigger", "parse_kinesis_uri", "send")
