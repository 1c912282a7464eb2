"""What every queue provider must do through a real ``triggerer run --config`` process, on its
real broker: the contract of issue 24, written once.

A provider's test module subclasses :class:`ProviderContract` and gives two fixtures:

- ``broker``: a :class:`Broker` on the machine's shared instance;
- ``private_broker``: a :class:`PrivateBroker` of the test's own, on a free port, which
  :meth:`PrivateBroker.restart` stops and starts again on the same port (keeping its data
  where the broker can).

Each test makes its own :class:`Source` (a new stream, queue, subscription or topic) and
watches it with ``MessageQueueTrigger(queue=source.uri, **source.options)``. Message bodies are
JSON objects; every provider's payload holds the decoded body in ``"body"``. A provider whose
messages carry headers gives ``Source.send_binary``, which sends a CloudEvent in binary mode
under its binding's names.
"""

from __future__ import annotations

import abc
import json
import re
import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from tests.e2e.daemon import (
    WAIT_TIMEOUT_S,
    DaemonProcess,
    event_count,
    events_of,
    trigger_rows,
    triggerer_cli,
    wait_for,
    without_triggerer_variables,
    write_config,
    write_pipelines,
)
from triggerer.service.store import models

MESSAGES = 1_000
KILL_AFTER = 300
"""Events committed when the daemon is killed: well inside the flow of ``MESSAGES``."""
POISON_AT = 20
"""The place of the poison message among ``2 * POISON_AT + 1``."""

MISSING_RESTARTS = 6
"""Failures of a watcher whose source is missing before a test makes the source: past them the
daemon's plain backoff (doubling from 1 s towards ``restart_backoff_max_s``, 60 s) waits 16 s
or more, while a missing source is looked for again every 5 s at most."""
FOUND_WITHIN_S = 15.0
"""How soon after a missing source is made its watcher reads it: at most 5 s until the
daemon looks again, and time for a busy machine to connect."""

POISON_FILTER = '''
def refuse_poison(payload):
    """Raises on the poison message, every time it is delivered."""
    if payload["body"].get("poison"):
        raise ValueError("poison message refused")
    return payload
'''
"""A module in the pipelines folder (which the daemon imports from): the poison test's
``apply_function``."""


@dataclass(frozen=True)
class Source:
    """One test's queue on a real broker."""

    uri: str
    """What ``MessageQueueTrigger(queue=...)`` is given."""
    send: Callable[[Sequence[str]], Awaitable[None]]
    """Posts message bodies (text), in order."""
    options: dict[str, Any] = field(default_factory=dict)
    """The trigger's other options (a connection's name, a delivery limit, ...)."""
    connections: dict[str, dict[str, Any]] = field(default_factory=dict)
    """``[connections.NAME]`` sections the config file must hold."""
    send_binary: Callable[[Mapping[str, str], bytes], Awaitable[None]] | None = None
    """Posts one CloudEvent in binary mode: its attributes (by their names; the provider
    writes them as its binding does) and its data, JSON (the content type says so); ``None``
    when the provider reads CloudEvents in structured mode only."""


class Broker(abc.ABC):
    """One provider's running broker, as the contract tests use it."""

    @abc.abstractmethod
    async def source(self) -> Source:
        """A new queue (stream, subscription, topic) of this test's own, ready to send to."""

    def bad_uris(self) -> list[tuple[str, str]]:
        """URIs a watcher may be given that are not this provider's form, each with a text its
        watcher's error must hold (the value it names)."""
        return []


class PrivateBroker(Broker):
    """A broker of one test's own, which it may restart."""

    @abc.abstractmethod
    async def restart(self) -> None:
        """Stop the broker, then start it again on the same port."""


def watching(source: Source, **options: Any) -> str:
    """A pipelines source whose asset ``stream`` has an event for each message of ``source``."""
    trigger_options = {**source.options, **options}
    return f"""
from triggerer import Asset, AssetWatcher
from watchers import MessageQueueTrigger

stream = Asset("stream", watchers=[AssetWatcher(
    "stream_queue", MessageQueueTrigger(queue={source.uri!r}, **{trigger_options!r}))])
"""


def daemon(
    tmp_path: Path, database_url: str, source: Source, *, api: bool = False
) -> DaemonProcess:
    """``triggerer run --config FILE`` for the pipelines in ``tmp_path / "pipelines"``, not
    started yet; no Spark (the tests run no pipeline), and the API only with ``api`` (open, on
    a free loopback port: see ``tests.e2e.test_api.api_url``)."""
    sections: dict[str, dict[str, Any]] = {
        "database": {"url": database_url},
        "pipelines": {"dir": str(tmp_path / "pipelines"), "reload_interval_s": 0.2},
        "daemon": {"heartbeat_interval_s": 0.5},
        "logging": {"format": "json"},
        "api": {"enabled": True, "port": 0, "tokens": []} if api else {"enabled": False},
        **{f"connections.{name}": values for name, values in source.connections.items()},
    }
    config = write_config(tmp_path / "triggerer.toml", sections)
    return DaemonProcess(without_triggerer_variables(), tmp_path / "daemon.log", config)


def numbers(events: Sequence[Any]) -> list[int]:
    """The ``i`` each event's message carried, sorted."""
    return sorted(event.extra["payload"]["body"]["i"] for event in events)


async def send_numbered(source: Source, start: int, stop: int, *, batch: int = 50) -> None:
    """Send ``{"i": start}`` up to ``{"i": stop - 1}``, ``batch`` at a time."""
    for first in range(start, stop, batch):
        await source.send([json.dumps({"i": i}) for i in range(first, min(first + batch, stop))])
        await anyio.sleep(0.02)


async def stored(database_url: str) -> int:
    return await wait_for(database_url, lambda s: event_count(s, "stream"), lambda _: True)


CLOUDEVENT_SOURCE = "https://shop.example/orders"


def cloudevent_attributes(event_id: str) -> dict[str, str]:
    """The required attributes of a CloudEvent of the tests' source."""
    return {
        "specversion": "1.0",
        "id": event_id,
        "source": CLOUDEVENT_SOURCE,
        "type": "com.example.order.created",
    }


async def duplicates_reach(
    api: str, count: int, *, token: str | None = None, timeout_s: float = WAIT_TIMEOUT_S
) -> None:
    """Wait until the daemon whose API is at ``api`` has kept ``count`` events out by their
    dedup keys (its metric ``triggerer_event_duplicates_total``)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with anyio.fail_after(timeout_s):
        async with httpx.AsyncClient(headers=headers) as client:
            while True:
                text = (await client.get(f"{api}/metrics")).text
                found = re.search(r"^triggerer_event_duplicates_total (\S+)$", text, re.M)
                if found and float(found[1]) >= count:
                    return
                await anyio.sleep(0.2)


async def dead_letter_count(session: AsyncSession) -> int:
    return await session.scalar(select(func.count()).select_from(models.DeadLetter)) or 0


async def failed_missing(
    process: DaemonProcess, database_url: str, *, times: int = MISSING_RESTARTS
) -> str:
    """Wait until the daemon's one watcher has failed ``times`` times; its last error."""
    await process.wait_logged("pipelines_loaded")
    rows = await wait_for(
        database_url,
        trigger_rows,
        lambda rows: len(rows) == 1 and rows[0].restart_count >= times,
        timeout_s=90,
    )
    error = rows[0].last_error
    assert error is not None
    return error


async def posted(process: DaemonProcess, provider: str, uri: str, *bodies: str) -> None:
    """``triggerer post PROVIDER URI BODIES`` with the daemon's config file, as a user posts."""
    assert process.arguments[:2] == ["run", "--config"]
    done = await triggerer_cli(
        process.env, "--config", process.arguments[2], "post", provider, uri, *bodies
    )
    assert done.returncode == 0, done.stderr


async def post_and_store(
    process: DaemonProcess,
    database_url: str,
    provider: str,
    uri: str,
    i: int,
    *,
    timeout_s: float = WAIT_TIMEOUT_S,
) -> None:
    """``triggerer post`` the message ``{"i": i}``, then wait until the watcher has stored
    ``i`` events in all."""
    await posted(process, provider, uri, json.dumps({"i": i}))
    await wait_for(
        database_url, lambda s: event_count(s, "stream"), lambda n: n >= i, timeout_s=timeout_s
    )


async def settled_events(process: DaemonProcess, database_url: str) -> list[Any]:
    """The events stored once anything delivered twice would be stored too, the daemon still
    running."""
    await anyio.sleep(1)
    events = await wait_for(database_url, lambda s: events_of(s, "stream"), bool)
    assert process.process is not None
    assert process.process.poll() is None, process.tail()
    return events


async def listed(process: DaemonProcess, *arguments: str) -> Any:
    """The JSON a CLI listing prints, run against the daemon's config file."""
    assert process.arguments[:2] == ["run", "--config"]
    done = await triggerer_cli(process.env, "--config", process.arguments[2], *arguments, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


class ProviderContract:
    """The contract tests; a provider's module subclasses this and gives the fixtures."""

    @pytest.mark.timeout(300)
    @pytest.mark.parametrize("db_backend", ["postgresql"], indirect=True)
    async def test_each_message_is_one_event_across_a_kill_9(
        self, broker: Broker, tmp_path: Path, database_url: str
    ) -> None:
        source = await broker.source()
        write_pipelines(tmp_path / "pipelines", watching(source))
        with daemon(tmp_path, database_url, source) as process:
            process.start()
            await process.wait_logged("pipelines_loaded")
            async with anyio.create_task_group() as group:
                group.start_soon(send_numbered, source, 0, MESSAGES)
                await wait_for(
                    database_url,
                    lambda s: event_count(s, "stream"),
                    lambda n: n >= KILL_AFTER,
                    timeout_s=120,
                )
                process.signal(signal.SIGKILL)
                assert await process.wait(30) == -signal.SIGKILL
                process.start()
            await wait_for(
                database_url,
                lambda s: event_count(s, "stream"),
                lambda n: n >= MESSAGES,
                timeout_s=180,
            )
            await anyio.sleep(2)  # anything delivered twice would be stored by now
            events = await wait_for(database_url, lambda s: events_of(s, "stream"), bool)
            assert process.process is not None
            assert process.process.poll() is None, process.tail()
        assert numbers(events) == list(range(MESSAGES))

    @pytest.mark.timeout(180)
    @pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
    async def test_a_poison_message_is_one_dead_letter_and_the_rest_flow(
        self, broker: Broker, tmp_path: Path, database_url: str
    ) -> None:
        source = await broker.source()
        folder = tmp_path / "pipelines"
        write_pipelines(folder, POISON_FILTER, "poison.py")
        write_pipelines(folder, watching(source, apply_function="poison.refuse_poison"))
        bodies = [json.dumps({"i": i}) for i in range(2 * POISON_AT)]
        bodies.insert(POISON_AT, json.dumps({"i": -1, "poison": True}))
        with daemon(tmp_path, database_url, source) as process:
            process.start()
            await process.wait_logged("pipelines_loaded")
            await source.send(bodies)
            await wait_for(
                database_url,
                lambda s: event_count(s, "stream"),
                lambda n: n >= 2 * POISON_AT,
                timeout_s=120,
            )
            await wait_for(database_url, dead_letter_count, lambda n: n >= 1, timeout_s=120)
            await anyio.sleep(2)  # a second dead letter or a redelivered event would be here
            letters = await listed(process, "events", "dead-letters")
            events = await wait_for(database_url, lambda s: events_of(s, "stream"), bool)
            assert process.process is not None
            assert process.process.poll() is None, process.tail()
        assert numbers(events) == list(range(2 * POISON_AT))
        [letter] = letters
        assert letter["asset"] == "stream"
        assert "poison message refused" in letter["reason"]
        assert json.loads(letter["payload"])["payload"]["body"]["poison"] is True

    @pytest.mark.timeout(300)
    @pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
    async def test_a_broker_restart_loses_nothing(
        self, private_broker: PrivateBroker, tmp_path: Path, database_url: str
    ) -> None:
        source = await private_broker.source()
        write_pipelines(tmp_path / "pipelines", watching(source))
        half = MESSAGES // 10
        with daemon(tmp_path, database_url, source) as process:
            process.start()
            await process.wait_logged("pipelines_loaded")
            await send_numbered(source, 0, half)
            await wait_for(database_url, lambda s: event_count(s, "stream"), lambda n: n >= half)
            await private_broker.restart()
            await send_numbered(source, half, 2 * half)
            await wait_for(
                database_url,
                lambda s: event_count(s, "stream"),
                lambda n: n >= 2 * half,
                timeout_s=180,
            )
            watchers = await listed(process, "watchers", "list")
            events = await wait_for(database_url, lambda s: events_of(s, "stream"), bool)
            assert process.process is not None
            assert process.process.poll() is None, process.tail()
        assert numbers(events) == list(range(2 * half))
        assert [watcher["state"] for watcher in watchers] == ["running"]

    @pytest.mark.timeout(180)
    @pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
    async def test_a_bad_uri_is_its_watchers_error_and_the_daemon_stays_up(
        self, broker: Broker, tmp_path: Path, database_url: str
    ) -> None:
        bad = broker.bad_uris()
        assert bad, "a provider names at least one bad URI"
        source = await broker.source()
        # The bad watchers in the good one's file: each fails alone, the good one flows.
        text = watching(source) + "".join(
            f"\nbad{number} = Asset('bad{number}', watchers=[AssetWatcher("
            f"'bad{number}_queue', MessageQueueTrigger(queue={uri!r}))])\n"
            for number, (uri, _) in enumerate(bad)
        )
        write_pipelines(tmp_path / "pipelines", text)
        with daemon(tmp_path, database_url, source) as process:
            process.start()
            await process.wait_logged("pipelines_loaded")
            await source.send([json.dumps({"i": 0})])
            await wait_for(database_url, lambda s: event_count(s, "stream"), lambda n: n >= 1)
            watchers = {row["watcher"]: row for row in await listed(process, "watchers", "list")}
            assert process.process is not None
            assert process.process.poll() is None, process.tail()
        assert watchers["stream_queue"]["state"] == "running"
        for number, (uri, named) in enumerate(bad):
            watcher = watchers[f"bad{number}_queue"]
            assert watcher["state"] == "failed", (uri, watcher)
            assert named in watcher["last_error"], (uri, watcher)

    @pytest.mark.timeout(180)
    @pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
    async def test_a_cloudevent_is_one_event_by_its_source_and_id(
        self, broker: Broker, tmp_path: Path, database_url: str
    ) -> None:
        """Structured mode (a body alone) on every provider, binary mode where it has headers:
        each CloudEvent is one event however often and however it came; a malformed one is a
        dead letter naming the attribute, and the next message flows."""
        from tests.e2e.test_api import api_url  # the test module that reads the API's address

        source = await broker.source()
        write_pipelines(tmp_path / "pipelines", watching(source))
        first = json.dumps({**cloudevent_attributes("order-1"), "data": {"i": 1}})
        no_source = {**cloudevent_attributes("order-0"), "data": {"i": 0}}
        del no_source["source"]
        ids, copies = ["order-1", None], 1
        with daemon(tmp_path, database_url, source, api=True) as process:
            process.start()
            await process.wait_logged("pipelines_loaded")
            await process.wait_logged("api_listening")
            await source.send([first, first, json.dumps(no_source), json.dumps({"i": 2})])
            if source.send_binary is not None:  # a copy of order-1, and order-3
                await source.send_binary(cloudevent_attributes("order-1"), b'{"i": 1}')
                await source.send_binary(cloudevent_attributes("order-3"), b'{"i": 3}')
                ids, copies = [*ids, "order-3"], 2
            await wait_for(
                database_url,
                lambda s: event_count(s, "stream"),
                lambda n: n >= len(ids),
                timeout_s=120,
            )
            await wait_for(database_url, dead_letter_count, lambda n: n >= 1, timeout_s=120)
            await duplicates_reach(api_url(process), copies)  # every copy read, and kept out
            letters = await listed(process, "events", "dead-letters")
            events = await wait_for(database_url, lambda s: events_of(s, "stream"), bool)
            assert process.process is not None
            assert process.process.poll() is None, process.tail()
        by_id = {
            event.extra["cloudevent"]["id"] if "cloudevent" in event.extra else None: event
            for event in events
        }
        assert sorted(by_id, key=str) == sorted(ids, key=str)
        assert len(events) == len(ids)
        assert by_id["order-1"].extra["cloudevent"]["data"] == {"i": 1}
        assert by_id["order-1"].extra["cloudevent"]["source"] == CLOUDEVENT_SOURCE
        assert by_id[None].extra["payload"]["body"] == {"i": 2}
        if "order-3" in by_id:
            cloudevent = by_id["order-3"].extra["cloudevent"]
            assert (cloudevent["data"], cloudevent["datacontenttype"]) == (
                {"i": 3},
                "application/json",
            )
        [letter] = letters
        assert "CloudEvent attribute 'source' is missing" in letter["reason"]
