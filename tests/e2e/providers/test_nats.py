"""The provider contract for NATS JetStream, through ``triggerer run --config``: on the machine's
shared server, and on a private one restarted on its port with its store kept."""

from __future__ import annotations

import json
import signal
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

import anyio
import nats
import pytest

from tests.e2e.daemon import event_count, events_of, wait_for, write_pipelines
from tests.e2e.providers.contract import (
    FOUND_WITHIN_S,
    Broker,
    PrivateBroker,
    ProviderContract,
    Source,
    daemon,
    dead_letter_count,
    failed_missing,
    listed,
    numbers,
    post_and_store,
    posted,
    settled_events,
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

        async def send_binary(attributes: Mapping[str, str], data: bytes) -> None:
            headers = {f"ce-{key}": quote(value) for key, value in attributes.items()}
            headers |= {"ce-datacontenttype": "application/json", "Nats-Msg-Id": uuid.uuid4().hex}
            client = await nats.connect(f"nats://{self.servers}")
            try:
                await client.jetstream().publish(f"{name}.in", data, stream=name, headers=headers)
            finally:
                await client.close()

        # A short ack wait: a message held by the killed daemon comes back soon.
        return Source(
            uri=f"nats://{self.servers}/{name}/{name}.%3E",
            send=send,
            options={"ack_wait_s": 5, "fetch_wait_s": 1},
            send_binary=send_binary,
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
async def broker() -> AsyncIterator[NatsBroker]:
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


def missing_stream(broker: NatsBroker, **options: object) -> tuple[str, Source]:
    """A stream of the test's own that does not exist yet (deleted after the test), and the
    source of its subject; the stream's name."""
    name = f"triggerer-test-{uuid.uuid4().hex[:12]}"
    broker.streams.append(name)
    subject_uri = f"nats://{broker.servers}/{name}/{name}.in"

    async def send(bodies: Sequence[str]) -> None:
        await PROVIDER.send(subject_uri, list(bodies))

    return name, Source(uri=subject_uri, send=send, options={"fetch_wait_s": 1, **options})


@pytest.mark.timeout(240)
@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
async def test_a_stream_created_after_the_watcher_started_is_read_within_seconds(
    broker: NatsBroker, tmp_path: Path, database_url: str
) -> None:
    """Issue 29, for NATS: the watcher's stream is missing (its error, looked for again every
    5 s at most, not after a backoff grown towards a minute); the stream is created and the
    first message published to it is an event within seconds (the durable, made then with
    ``deliver_policy="all"``, the default, reads what the stream holds)."""
    name, source = missing_stream(broker)
    write_pipelines(tmp_path / "pipelines", watching(source))
    with daemon(tmp_path, database_url, source) as process:
        process.start()
        error = await failed_missing(process, database_url)
        await create_stream(broker.servers, name)
        await post_and_store(process, database_url, "nats", source.uri, 1, timeout_s=FOUND_WITHIN_S)
        await post_and_store(process, database_url, "nats", source.uri, 2)
        events = await settled_events(process, database_url)
    assert f"NATS stream {name!r} does not exist" in error
    assert numbers(events) == [1, 2]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
async def test_new_on_a_stream_created_while_the_daemon_is_down_reads_its_first_message(
    broker: NatsBroker, tmp_path: Path, database_url: str
) -> None:
    """``deliver_policy="new"``: the stream is missing at the watcher's first start, then
    created and written to while the daemon is down. Its durable, made by the next start, was
    ``new`` from then on and skipped that message; the stream was created after the watcher
    first started, so every message of it is new to the watcher: the durable reads them all."""
    name, source = missing_stream(broker, deliver_policy="new")
    write_pipelines(tmp_path / "pipelines", watching(source))
    with daemon(tmp_path, database_url, source) as process:
        process.start()
        await failed_missing(process, database_url, times=1)
        process.signal(signal.SIGTERM)
        assert await process.wait(60) == 0, process.tail()
        await create_stream(broker.servers, name)
        await posted(process, "nats", source.uri, json.dumps({"i": 1}))
        process.start()
        await wait_for(database_url, lambda s: event_count(s, "stream"), lambda n: n >= 1)
        await post_and_store(process, database_url, "nats", source.uri, 2)
        events = await settled_events(process, database_url)
    assert numbers(events) == [1, 2]
