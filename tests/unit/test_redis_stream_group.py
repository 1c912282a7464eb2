"""StreamGroupReader.close() against a client that never answers: no I/O."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from watchers.redis import stream_group as redis_stream_group
from watchers.redis.address import RedisAddress
from watchers.redis.stream_group import StreamGroupReader


class HangingRedis:
    """A client whose XACK never returns."""

    def __init__(self) -> None:
        self.closed = False

    async def xack(self, *args: Any) -> int:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        self.closed = True


async def test_the_client_is_closed_when_the_final_acks_time_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(redis_stream_group, "_CLEANUP_TIMEOUT_S", 0.1)
    tally = SimpleNamespace(acked=0, lost=0, polled=lambda: None)
    reader = StreamGroupReader(
        address=RedisAddress("localhost", 6379, 0, "orders"),
        stream="orders",
        group="g",
        start_id="0",
        min_idle_ms=30_000,
        block_ms=100,
        batch_size=10,
        max_in_flight=10,
        tally=tally,
    )
    client = HangingRedis()
    reader.open(client)  # type: ignore[arg-type]  # a stand-in with the two calls close() makes
    reader.skipped("1-0")  # an acknowledgement waiting to be sent
    with capture_logs() as logs, anyio.fail_after(5):
        await reader.close()
    assert client.closed
    assert [entry["event"] for entry in logs] == ["redis_stream_final_ack_timed_out"]
    assert tally.acked == 0
    await reader.close()  # idempotent
