"""The MQTT provider: ``MqttTrigger``, ``send`` and the provider (:mod:`watchers.mqtt.trigger`),
``mqtt://`` URIs (:mod:`watchers.mqtt.address`)."""

from watchers.mqtt.trigger import (
    MESSAGE_ID_PROPERTY,
    PROVIDER,
    MqttTrigger,
    send,
    watcher_client_id,
)

__all__ = ("MESSAGE_ID_PROPERTY", "PROVIDER", "MqttTrigger", "send", "watcher_client_id")
