"""The provider contract for Google Pub/Sub (``pubsub://``), through ``triggerer run``, on the
Pub/Sub emulator.

Subscriptions are made with the shortest ack deadline (10 s): after the kill -9, the messages
the dead daemon held come back that long after their last extension. The shared emulator is
also the daemon's ``PUBSUB_EMULATOR_HOST`` (the bad URIs name no ``emulator_host``).

The emulator keeps nothing across a restart: no topic, subscription or message, and its
message ids start again at 1. So the restart test proves that the watcher retries with backoff
while the emulator is away and reconnects (a pull that finds the subscription missing fails the
watcher, which the daemon restarts), and that the messages posted after the restart flow: the
private broker makes its topics and subscriptions again as it restarts. Their ids repeat those
of the messages stored before; their dedup keys do not, as the keys hold the publish time.
Messages not yet pulled when the emulator stops are lost with it:
the contract's restart test waits until those it sent first are stored.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.e2e.providers.contract import Broker, PrivateBroker, ProviderContract, Source
from tests.fixtures.pubsub import PROJECT, Admin, pubsub_emulator
from watchers.pubsub import send

if TYPE_CHECKING:
    from deploy.local.services import Service


class PubSubEmulator(Broker):
    """Subscriptions of their own (``e2e-<uuid>``, each on its topic) on one emulator."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.admin = Admin(host)
        self.made: list[str] = []

    async def source(self) -> Source:
        name = f"e2e-{uuid.uuid4().hex[:12]}"
        uri = await self.admin.create(name, ack_deadline_s=10)
        self.made.append(name)

        async def post(bodies: Sequence[str]) -> None:
            await send(uri, bodies, emulator_host=self.host)

        async def send_binary(attributes: Mapping[str, str], data: bytes) -> None:
            named = {f"ce-{name}": value for name, value in attributes.items()}
            named["content-type"] = "application/json"
            await send(uri, [data], attributes=named, emulator_host=self.host)

        return Source(
            uri=uri, send=post, options={"emulator_host": self.host}, send_binary=send_binary
        )

    def bad_uris(self) -> list[tuple[str, str]]:
        return [
            (f"pubsub://{PROJECT}/1bad", "'1bad'"),
            (f"pubsub://reader:s3cret@{PROJECT}/orders", "connection='NAME'"),
            (f"pubsub://{PROJECT}", f"'pubsub://{PROJECT}'"),
        ]

    async def close(self) -> None:
        await self.admin.aclose()


class PrivatePubSubEmulator(PubSubEmulator, PrivateBroker):
    def __init__(self, service: Service) -> None:
        super().__init__(service.address)
        self.service = service

    async def restart(self) -> None:
        """Stop the emulator and start it again, then make its subscriptions again (it comes
        back empty, numbering messages from 1 again)."""
        self.service.stop()
        self.service.start(timeout_s=60)
        for name in self.made:
            await self.admin.create(name, ack_deadline_s=10)


@pytest.fixture
async def broker(
    pubsub_emulator_host: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Broker]:
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", pubsub_emulator_host)
    shared = PubSubEmulator(pubsub_emulator_host)
    try:
        yield shared
    finally:
        await shared.close()


@pytest.fixture
async def private_broker(services_log_dir: Path) -> AsyncIterator[PrivateBroker]:
    service = pubsub_emulator(services_log_dir)
    service.start(timeout_s=60)
    private = PrivatePubSubEmulator(service)
    try:
        yield private
    finally:
        await private.close()
        service.stop()


class TestPubSub(ProviderContract):
    pass
