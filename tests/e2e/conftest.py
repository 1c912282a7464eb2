"""Fixtures of the end-to-end tests: a :class:`Deployment` per test."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.e2e.daemon import Deployment, sqlite_url

if TYPE_CHECKING:
    from tests.fixtures.brokers import MakeTopic

MakeDeployment = Callable[..., Awaitable[Deployment]]


@pytest.fixture
def make_deployment(
    tmp_path: Path, kafka_broker: str, make_topic: MakeTopic, spark_remote: str
) -> MakeDeployment:
    """``await make_deployment(database_url, partitions=1)``: a deployment on a new topic."""

    async def make(database_url: str, *, partitions: int = 1) -> Deployment:
        topic = await make_topic(partitions)
        return Deployment(tmp_path, database_url, spark_remote, kafka_broker, topic)

    return make


@pytest.fixture
async def deployment(tmp_path: Path, make_deployment: MakeDeployment) -> Deployment:
    """A deployment on a new one-partition topic and a new SQLite file."""
    return await make_deployment(sqlite_url(tmp_path))
