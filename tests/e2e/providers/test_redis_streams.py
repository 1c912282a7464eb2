"""The provider contract for Redis Streams (``redis+stream://``), through ``triggerer run``.

The watcher's group starts at ``0`` (the contract sends once the pipelines are loaded, maybe
before the group is made) and claims entries pending for 2 s: after the kill -9, the dead
consumer's entries are claimed by the new daemon's consumer that long after they were read.
"""

from __future__ import annotations

import json
import signal
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

import pytest
import redis.asyncio

from tests.e2e.daemon import event_count, wait_for, write_pipelines
from tests.e2e.providers.contract import (
    FOUND_WITHIN_S,
    Broker,
    PrivateBroker,
    ProviderContract,
    Source,
    daemon,
    failed_missing,
    listed,
    numbers,
    post_and_store,
    posted,
    settled_events,
    watching,
)
from tests.fixtures.redis import SHARED_REDIS_HOST, SHARED_REDIS_PORT, create_stream
from watchers.redis.streams import send

if TYPE_CHECKING:
    from pathlib import Path

    from deploy.local.services import Service

OPTIONS = {"start_id": "0", "min_idle_ms": 2000}


class RedisStreams(Broker):
    """Streams of their own (``triggerer-test-<uuid>``) on one Redis server, removed after."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.client = redis.asyncio.Redis(host=SHARED_REDIS_HOST, port=port)
        self.made: list[str] = []

    async def source(self) -> Source:
        name = f"triggerer-test-{uuid.uuid4().hex}"
        await create_stream(self.client, name)
        self.made.append(name)
        uri = f"redis+stream://{SHARED_REDIS_HOST}:{self.port}/0/{name}"

        async def post(bodies: Sequence[str]) -> None:
            await send(uri, bodies)

        return Source(uri=uri, send=post, options=dict(OPTIONS))

    def bad_uris(self) -> list[tuple[str, str]]:
        return [
            ("redis+stream://127.0.0.1/zero/orders", "'zero'"),
            ("redis+stream://reader:s3cret@127.0.0.1/0/orders", "connection='NAME'"),
            ("redis+stream://127.0.0.1/0", "redis+stream://127.0.0.1/0"),
        ]

    async def close(self) -> None:
        if self.made:
            await self.client.delete(*self.made)
        await self.client.aclose()


class PrivateRedisStreams(RedisStreams, PrivateBroker):
    def __init__(self, service: Service) -> None:
        super().__init__(service.port)
        self.service = service

    async def restart(self) -> None:
        self.service.stop()  # SIGTERM: the append-only file is written
        self.service.start()


@pytest.fixture
async def broker() -> AsyncIterator[Broker]:
    shared = RedisStreams(SHARED_REDIS_PORT)
    try:
        yield shared
    finally:
        await shared.close()


@pytest.fixture
async def private_broker(private_redis: Service) -> AsyncIterator[PrivateBroker]:
    private = PrivateRedisStreams(private_redis)
    try:
        yield private
    finally:
        await private.client.aclose()


class TestRedisStreams(ProviderContract):
    """The contract on Redis Streams."""


def missing_stream(broker: RedisStreams) -> Source:
    """A stream of the test's own that does not exist yet, read from the watcher's first start
    (``start_id`` left at its default ``$``); deleted after the test."""
    name = f"triggerer-test-{uuid.uuid4().hex}"
    broker.made.append(name)
    uri = f"redis+stream://{SHARED_REDIS_HOST}:{broker.port}/0/{name}"

    async def post(bodies: Sequence[str]) -> None:
        await send(uri, bodies)

    return Source(uri=uri, send=post)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
async def test_the_first_entry_of_a_stream_made_after_the_watcher_started_is_an_event(
    broker: RedisStreams, tmp_path: Path, database_url: str
) -> None:
    """Issue 29: the watcher finds the stream missing; ``triggerer post`` makes it with its
    first entry. The group the watcher then makes starts at its first start, before that
    entry (it started at ``$``, after it: the entry was never an event), and the watcher
    finds the stream within seconds of the post, however often it failed before."""
    source = missing_stream(broker)
    write_pipelines(tmp_path / "pipelines", watching(source))
    with daemon(tmp_path, database_url, source) as process:
        process.start()
        error = await failed_missing(process, database_url)
        await post_and_store(
            process, database_url, "redis-streams", source.uri, 1, timeout_s=FOUND_WITHIN_S
        )
        await post_and_store(process, database_url, "redis-streams", source.uri, 2)
        events = await settled_events(process, database_url)
        watchers = await listed(process, "watchers", "list")
    assert "does not exist" in error
    assert "RedisStreamMissing" in error
    assert numbers(events) == [1, 2]
    assert [watcher["state"] for watcher in watchers] == ["running"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
async def test_a_stream_made_while_the_daemon_is_down_is_read_from_its_first_entry(
    broker: RedisStreams, tmp_path: Path, database_url: str
) -> None:
    """The restart gap: the stream is missing at the watcher's first start, the daemon stops,
    the stream is made with its first entry, the daemon starts again and finds the stream but
    no group. The group starts at the watcher's first start, stored by the first daemon."""
    source = missing_stream(broker)
    write_pipelines(tmp_path / "pipelines", watching(source))
    with daemon(tmp_path, database_url, source) as process:
        process.start()
        await failed_missing(process, database_url, times=1)
        process.signal(signal.SIGTERM)
        assert await process.wait(60) == 0, process.tail()
        await posted(process, "redis-streams", source.uri, json.dumps({"i": 1}))
        process.start()
        await wait_for(database_url, lambda s: event_count(s, "stream"), lambda n: n >= 1)
        await post_and_store(process, database_url, "redis-streams", source.uri, 2)
        events = await settled_events(process, database_url)
    assert numbers(events) == [1, 2]
