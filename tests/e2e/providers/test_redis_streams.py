"""The provider contract for Redis Streams (``redis+stream://``), through ``triggerer run``.

The watcher's group starts at ``0`` (the contract sends once the pipelines are loaded, maybe
before the group is made) and claims entries pending for 2 s: after the kill -9, the dead
consumer's entries are claimed by the new daemon's consumer that long after they were read.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

import pytest
import redis.asyncio

from tests.e2e.providers.contract import Broker, PrivateBroker, ProviderContract, Source
from tests.fixtures.redis import SHARED_REDIS_HOST, SHARED_REDIS_PORT, create_stream
from watchers.redis_streams import send

if TYPE_CHECKING:
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
