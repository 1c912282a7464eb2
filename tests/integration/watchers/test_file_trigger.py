"""FileTrigger on a real directory: new files become events, acks survive restarts."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from anyio.streams.memory import MemoryObjectReceiveStream

from triggerer.triggers import BaseEventTrigger, SourceMissing, TriggerEvent, load_trigger
from watchers import FileTrigger

POLL_S = 0.02


Events = MemoryObjectReceiveStream[TriggerEvent]


@contextlib.asynccontextmanager
async def running(trigger: BaseEventTrigger) -> AsyncIterator[Events]:
    """The trigger's events, pumped by a task so that waiting for one never closes ``run``."""
    send, receive = anyio.create_memory_object_stream[TriggerEvent](100)

    async def pump() -> None:
        async with send:
            async for event in trigger.run():
                await send.send(event)

    with receive:
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(pump)
                yield receive
                group.cancel_scope.cancel()
        finally:
            await trigger.cleanup()


async def next_event(events: Events) -> TriggerEvent:
    with anyio.fail_after(5):
        return await events.receive()


async def nothing_within(events: Events, polls: int = 10) -> bool:
    """True when no event comes within ``polls`` poll intervals."""
    with anyio.move_on_after(polls * POLL_S):
        await events.receive()
        return False
    return True


async def test_new_file_becomes_an_event(tmp_path: Path) -> None:
    trigger = FileTrigger(str(tmp_path), "*.csv", poll_interval_s=POLL_S)
    async with running(trigger) as events:
        assert await nothing_within(events)
        path = tmp_path / "orders.csv"
        path.write_text("a,b\n")
        (tmp_path / "notes.txt").write_text("not matched")
        (tmp_path / ".orders2.csv").write_text("hidden: still being written")
        event = await next_event(events)
        stat = path.stat()
        assert event.payload == {"path": str(path), "size": 4, "mtime": stat.st_mtime}
        assert event.dedup_key == f"{path}:{stat.st_mtime_ns}:4"
        assert await nothing_within(events)  # yielded once, even before the ack


async def test_acked_file_is_not_yielded_again_also_after_a_restart(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("1")
    trigger = FileTrigger(str(tmp_path), "*.csv", poll_interval_s=POLL_S)
    async with running(trigger) as events:
        event = await next_event(events)
        assert event.ack is not None
        await event.ack()
        assert await nothing_within(events)
    restarted = load_trigger(*trigger.serialize())
    async with running(restarted) as events:
        assert await nothing_within(events)
        (tmp_path / "b.csv").write_text("2")
        assert (await next_event(events)).payload["path"] == str(tmp_path / "b.csv")


async def test_unacked_file_is_yielded_again_after_a_restart(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("1")
    trigger = FileTrigger(str(tmp_path), poll_interval_s=POLL_S)
    async with running(trigger) as events:
        first = await next_event(events)
    async with running(FileTrigger(str(tmp_path), poll_interval_s=POLL_S)) as events:
        second = await next_event(events)
    assert second.dedup_key == first.dedup_key


async def test_changed_file_is_new(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text("1")
    trigger = FileTrigger(str(tmp_path), poll_interval_s=POLL_S)
    async with running(trigger) as events:
        first = await next_event(events)
        assert first.ack is not None
        await first.ack()
        path.write_text("12")
        os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
        second = await next_event(events)
    assert second.payload["size"] == 2
    assert second.dedup_key != first.dedup_key


async def test_ledger_forgets_removed_files_and_survives_a_torn_line(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("1")
    (tmp_path / "b.csv").write_text("2")
    trigger = FileTrigger(str(tmp_path), poll_interval_s=POLL_S)
    async with running(trigger) as events:
        for _ in range(2):
            event = await next_event(events)
            assert event.ack is not None
            await event.ack()
    ledger = tmp_path / ".triggerer-done"
    assert len(ledger.read_text().splitlines()) == 2
    (tmp_path / "a.csv").unlink()
    with ledger.open("a") as file:
        file.write('"cut sho')  # a crash in the middle of an append
    async with running(FileTrigger(str(tmp_path), poll_interval_s=POLL_S)) as events:
        assert await nothing_within(events)
    assert ledger.read_text().splitlines() == [ledger.read_text().splitlines()[0]]
    assert "b.csv" in ledger.read_text()


async def test_recursive_pattern(tmp_path: Path) -> None:
    (tmp_path / "day=1").mkdir()
    (tmp_path / "day=1" / "part-0.parquet").write_text("x")
    trigger = FileTrigger(str(tmp_path), "**/*.parquet", poll_interval_s=POLL_S)
    async with running(trigger) as events:
        event = await next_event(events)
    assert event.payload["path"] == str(tmp_path / "day=1" / "part-0.parquet")


async def test_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    trigger = FileTrigger(str(tmp_path / "nope"), poll_interval_s=POLL_S)
    with pytest.raises(SourceMissing, match=r"FileTrigger directory .*nope' does not exist"):
        async for _ in trigger.run():
            pass
