"""The NATS JetStream provider: ``NatsTrigger`` and the provider (:mod:`watchers.nats.trigger`),
``nats://`` URIs, connecting and ``send`` (:mod:`watchers.nats.client`), pulls
(:mod:`watchers.nats.pull`) and the messages held unacked (:mod:`watchers.nats.in_flight`)."""

from watchers.nats.client import send
from watchers.nats.trigger import PROVIDER, NatsTrigger

__all__ = ("PROVIDER", "NatsTrigger", "send")
