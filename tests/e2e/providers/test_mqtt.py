"""The provider contract for MQTT, through ``triggerer run --config`` on real Mosquitto brokers.

Each test's topic is new. A persistent session keeps only what is published after its first
subscription, so ``source()`` makes the session the daemon's watcher will resume (the client
id it derives from the watcher) and subscribes it before anything is sent: the daemon may
subscribe after the test has begun to send.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import aiomqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.e2e.providers.contract import Broker, PrivateBroker, ProviderContract, Source
from triggerer import Asset
from watchers.mqtt import send, watcher_client_id

if TYPE_CHECKING:
    from deploy.local.services import Service
    from tests.fixtures.services import ServiceAddresses

ASSET = "stream"
WATCHER = "stream_queue"
"""The asset and watcher names of the contract's pipelines (``contract.watching``)."""


class Mosquitto(Broker):
    """A Mosquitto the tests share (the machine's) or one of a test's own."""

    def __init__(self, port: int) -> None:
        self.port = port

    async def source(self) -> Source:
        uri = f"mqtt://127.0.0.1:{self.port}/triggerer-e2e/{uuid.uuid4().hex}"
        await make_session(uri, self.port)

        async def post(bodies: Sequence[str]) -> None:
            await send(uri, list(bodies))

        async def send_binary(attributes: Mapping[str, str], data: bytes) -> None:
            properties = Properties(PacketTypes.PUBLISH)
            properties.UserProperty = [*attributes.items(), ("message-id", uuid.uuid4().hex)]
            properties.ContentType = "application/json"
            async with aiomqtt.Client(
                "127.0.0.1", self.port, protocol=aiomqtt.ProtocolVersion.V5
            ) as client:
                await client.publish(uri.split("/", 3)[3], data, qos=1, properties=properties)

        return Source(uri=uri, send=post, send_binary=send_binary)

    def bad_uris(self) -> list[tuple[str, str]]:
        return [
            (f"mqtt://127.0.0.1:{self.port}/sensors/#", "write the topic wildcard '#' as %23"),
            (f"mqtt://127.0.0.1:{self.port}/a+/b", "may hold '+' only as a whole level"),
            ("mqtt://user:secret@127.0.0.1/a", "mqtt://***@127.0.0.1/a"),  # credentials hidden
        ]


class PrivateMosquitto(Mosquitto, PrivateBroker):
    def __init__(self, service: Service) -> None:
        super().__init__(service.port)
        self.service = service

    async def restart(self) -> None:
        self.service.stop()  # SIGTERM: Mosquitto writes its sessions and queued messages
        self.service.start()


async def make_session(uri: str, port: int) -> None:
    """Subscribe, at QoS 1, the session the daemon's watcher of ``uri`` will resume."""
    client_id = watcher_client_id(Asset(ASSET), WATCHER, uri)
    properties = Properties(PacketTypes.CONNECT)
    properties.SessionExpiryInterval = 3600
    async with aiomqtt.Client(
        "127.0.0.1",
        port,
        identifier=client_id,
        protocol=aiomqtt.ProtocolVersion.V5,
        clean_start=True,
        properties=properties,
    ) as client:
        await client.subscribe(uri.split("/", 3)[3], qos=1)


@pytest.fixture
def broker(service_addresses: ServiceAddresses) -> Mosquitto:
    return Mosquitto(int(service_addresses.mqtt.rpartition(":")[2]))


@pytest.fixture
def private_broker(private_mosquitto: Service) -> PrivateMosquitto:
    return PrivateMosquitto(private_mosquitto)


class TestMqtt(ProviderContract):
    """The contract on Mosquitto 2."""
