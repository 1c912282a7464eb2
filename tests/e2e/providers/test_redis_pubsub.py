"""Redis pub/sub (``redis+pubsub://``) through ``triggerer run``: a reduced contract, as the
channel keeps nothing (no kill -9 exactly-once, no redelivery, no dead letters to check).

Messages published while the watcher is subscribed become events, each once; the daemon warns
at the start that the watcher is at-most-once, naming it, and ``watchers list`` says so.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from tests.e2e.daemon import event_count, events_of, wait_for, write_pipelines
from tests.e2e.providers.contract import Source, daemon, listed, numbers, watching
from tests.fixtures.redis import SHARED_REDIS_HOST, SHARED_REDIS_PORT
from watchers.redis.pubsub import AT_MOST_ONCE, send

MESSAGES = 200


@pytest.mark.timeout(180)
@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
async def test_messages_published_while_running_are_events_and_the_start_warns(
    tmp_path: Path, database_url: str
) -> None:
    uri = f"redis+pubsub://{SHARED_REDIS_HOST}:{SHARED_REDIS_PORT}/0/triggerer-test-{uuid.uuid4().hex}"

    async def post(bodies: list[str]) -> None:
        await send(uri, bodies)

    source = Source(uri=uri, send=post)
    write_pipelines(tmp_path / "pipelines", watching(source))
    with daemon(tmp_path, database_url, source) as process:
        process.start()
        [warning] = await process.wait_logged("redis_pubsub_at_most_once")
        await process.wait_logged("redis_pubsub_subscribed")
        await send(uri, [json.dumps({"i": i}) for i in range(MESSAGES)])
        await wait_for(database_url, lambda s: event_count(s, "stream"), lambda n: n >= MESSAGES)
        watchers = await listed(process, "watchers", "list")
        events = await wait_for(database_url, lambda s: events_of(s, "stream"), bool)
        assert process.process is not None
        assert process.process.poll() is None, process.tail()
    assert numbers(events) == list(range(MESSAGES))
    assert warning["watcher"] == "stream_queue"
    assert warning["level"] == "warning"
    [watcher] = watchers
    assert watcher["state"] == "running"
    assert watcher["consumer_group"] == AT_MOST_ONCE
