"""The provider contract for NATS JetStream, through ``triggerer run --config``: on the machine's
shared server, and on a private one restarted on its port with its store kept."""

from __future__ import annotations

import json
import signal
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest

from tests.e2e.daemon import event_count, events_of, wait_for, write_pipelines
from tests.e2e.providers.contract import (
    Broker,
    PrivateBroker,
    ProviderContract,
    Source,
    daemon,
    dead_letter_count,
    listed,
    numbers,
    watching,
)
from tests.fixtures.nats import SHARED_NATS, create_stream, delete_stream, nats_server
from watchers.nats import PROVIDER

if TYPE_CHECKING:
    from deploy.local.services import Service

KILLER = '''
import os
import signal


def kill_on_poison(payload):
    """Kills the daemon, as a crash would, at each delivery of the poison message."""
    if payload["body"].get("poison"):
        os.kill(os.getpid(), signal.SIGKILL)
    return payload
'''
"""A module in the pipelines folder: the apply_function of the killed-at-each-delivery test."""


class NatsBroker(Broker):
    """Streams of each test's own (``<name>.>`` their subjects) on a JetStream server."""

    def __init__(self, servers: str) -> None:
        self.servers = servers
        self.streams: list[str] = []

    async def source(self) -> Source:
        name = f"triggerer-test-{uuid.uuid4().hex[:12]}"
        await create_stream(self.servers, name)
        self.streams.append(name)
        subject_uri = f"nats://{self.servers}/{name}/{name}.in"

        async def send(bodies: Sequence[str]) -> None:
            await PROVIDER.send(subject_uri, list(bodies))

        # A short ack wait: a message held by the killed daemon comes back soon.
        return Source(
            uri=f"nats://{self.servers}/{name}/{name}.%3E",
            send=send,
            options={"ack_wait_s": 5, "fetch_wait_s": 1},
        )

    def bad_uris(self) -> list[tuple[str, str]]:
        return [
            ("nats://127.0.0.1/no.dots/a", "'no.dots'"),
            ("nats://user:secret@127.0.0.1/S/a", "connection="),
            ("nats://127.0.0.1/S/a#b", "%23"),
        ]


class PrivateNats(NatsBroker, PrivateBroker):
    def __init__(self, service: Service) -> None:
        super().__init__(service.address)
        self.service = service

    async def restart(self) -> None:
        self.service.stop()
        self.service.start()


@pytest.fixture
async def broker() -> object:
    shared = NatsBroker(SHARED_NATS)
    yield shared
    for name in shared.streams:
        await delete_stream(SHARED_NATS, name)


@pytest.fixture
def private_broker(tmp_path: Path, services_log_dir: Path) -> Iterator[PrivateNats]:
    service = nats_server(tmp_path / "nats-store", services_log_dir)
    service.start()
    try:
        yield PrivateNats(service)
    finally:
        service.stop()


class TestNats(ProviderContract):
    @pytest.mark.timeout(180)
    @pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
    async def test_a_missing_stream_is_its_watchers_error(
        self, broker: NatsBroker, tmp_path: Path, database_url: str
    ) -> None:
        """Not a bad URI: the watcher retries (with backoff) until the stream is made."""
        source = await broker.source()
        missing = f"nats://{SHARED_NATS}/no-such-stream-{uuid.uuid4().hex[:6]}/a"
        text = watching(source) + (
            "\nmissing = Asset('missing', watchers=[AssetWatcher("
            f"'missing_queue', MessageQueueTrigger(queue={missing!r}))])\n"
        )
        write_pipelines(tmp_path / "pipelines", text)
        with daemon(tmp_path, database_url, source) as process:
            process.start()
            await process.wait_logged("pipelines_loaded")
            await source.send([json.dumps({"i": 0})])
            await wait_for(database_url, lambda s: event_count(s, "stream"), lambda n: n >= 1)
            with anyio.fail_after(60):
                while True:
                    rows = {
                        row["watcher"]: row for row in await listed(process, "watchers", "list")
                    }
                    if rows["missing_queue"]["last_error"]:
                        break
                    await anyio.sleep(0.5)
            assert process.process is not None
            assert process.process.poll() is None, process.tail()
        assert rows["stream_queue"]["state"] == "running"
        assert rows["stream_queue"]["consumer_group"].startswith("triggerer-stream_queue-")
        assert "does not exist" in rows["missing_queue"]["last_error"]
        assert missing.split("/")[3] in rows["missing_queue"]["last_error"]

    @pytest.mark.timeout(180)
    @pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
    async def test_a_message_killing_the_daemon_at_each_delivery_is_one_dead_letter(
        self, broker: NatsBroker, tmp_path: Path, database_url: str
    ) -> None:
        """No daemon reads when the message's last ack wait runs out: the server delivers it
        again all the same (a server-side max_deliver would drop it), and the delivery past
        ``max_deliveries`` is a dead letter, its apply_function not run again."""
        source = await broker.source()
        folder = tmp_path / "pipelines"
        write_pipelines(folder, KILLER, "killer.py")
        write_pipelines(
            folder,
            watching(
                source, apply_function="killer.kill_on_poison", max_deliveries=2, ack_wait_s=2
            ),
        )
        with daemon(tmp_path, database_url, source) as process:
            process.start()
            await process.wait_logged("pipelines_loaded")
            await source.send([json.dumps({"i": -1, "poison": True})])
            for _ in range(2):  # killed at each of its two deliveries, then started again
                assert await process.wait(60) == -signal.SIGKILL, process.tail()
                process.start()
            await wait_for(database_url, dead_letter_count, lambda n: n >= 1, timeout_s=60)
            await source.send([json.dumps({"i": i}) for i in range(3)])
            await wait_for(
                database_url, lambda s: event_count(s, "stream"), lambda n: n >= 3, timeout_s=60
            )
            letters = await listed(process, "events", "dead-letters")
            events = await wait_for(database_url, lambda s: events_of(s, "stream"), bool)
            assert process.process is not None
            assert process.process.poll() is None, process.tail()
        assert numbers(events) == [0, 1, 2]
        [letter] = letters
        assert letter["reason"] == (
            "delivered 3 times, more than max_deliveries=2, without its event being stored"
        )
        assert json.loads(letter["payload"])["payload"]["body"]["poison"] is True
