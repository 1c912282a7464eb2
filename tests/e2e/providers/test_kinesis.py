"""Kinesis (``kinesis://``) on moto through ``triggerer run``: the provider contract.

Exactly-once across a kill -9 comes from the shard positions the daemon stores with the events:
the restarted watcher reads each shard after its stored position, and what it reads again
(events of a batch that committed after its position was read back) is absorbed by the dedup
keys.

The broker restart: moto keeps streams in memory, so a restarted moto has lost the stream, and
a stream made again restarts its sequence numbers (new records under the keys of old ones);
a real Kinesis endpoint loses nothing when a connection drops. So the "private broker" is a
TCP proxy in front of the shared moto, which ``restart()`` stops (every connection cut, the
port refusing) and starts again on the same port: the watcher must meet the endpoint
unreachable, retry with backoff (``kinesis_call_failed``), reconnect and lose nothing. What it
cannot show is a Kinesis that comes back having lost data, which the real one does not do.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import threading
import urllib.parse
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path

import anyio
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from tests.e2e.daemon import DaemonProcess, event_count, wait_for, write_pipelines
from tests.e2e.providers.contract import (
    Broker,
    PrivateBroker,
    ProviderContract,
    Source,
    daemon,
    failed_missing,
    numbers,
    send_numbered,
    settled_events,
    watching,
)
from tests.fixtures.kinesis import create_stream
from triggerer.service.store.models import Lease, SourceCheckpoint
from watchers.kinesis import send


class MotoKinesis(Broker):
    """Streams on the shared moto server, reached at ``endpoint`` (moto, or a proxy of it)."""

    def __init__(self, moto_server: str, endpoint: str | None = None) -> None:
        self.moto_server = moto_server
        self.endpoint = endpoint or moto_server

    async def source(self) -> Source:
        from aiobotocore.session import get_session

        stream = f"stream-{uuid.uuid4().hex[:12]}"
        async with get_session().create_client("kinesis", endpoint_url=self.moto_server) as client:
            await create_stream(client, stream, shards=2)
        posting = f"kinesis://{stream}?endpoint_url={self.moto_server}&region=us-east-1"

        async def post(bodies: Sequence[str]) -> None:
            await send(posting, list(bodies))

        return Source(
            uri=f"kinesis://{stream}?endpoint_url={self.endpoint}&region=us-east-1",
            send=post,
            options={"poll_interval_s": 0.2},
        )

    def bad_uris(self) -> list[tuple[str, str]]:
        return [
            ("kinesis://bad*stream", "bad*stream"),
            ("kinesis://user:secret@orders", "connection="),
            ("kinesis://orders?shards=2", "shards"),
        ]


class Proxy:
    """A TCP proxy on a port of its own to ``target`` (host, port), in threads."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        with contextlib.closing(socket.socket()) as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self._server: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()

    def start(self) -> None:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", self.port))
        server.listen(64)
        self._server = server
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            with contextlib.suppress(OSError):
                server.shutdown(socket.SHUT_RDWR)
            server.close()
        with self._lock:
            connections, self._open = self._open, set()
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
            connection.close()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return  # stopped
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open |= {client, upstream}
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)


class ProxiedKinesis(MotoKinesis, PrivateBroker):
    """The shared moto behind a proxy of the test's own, which :meth:`restart` cuts."""

    def __init__(self, moto_server: str, proxy: Proxy) -> None:
        super().__init__(moto_server, f"http://127.0.0.1:{proxy.port}")
        self.proxy = proxy

    async def restart(self) -> None:

        self.proxy.stop()
        await anyio.sleep(3)  # long enough for the watcher to fail calls and back off
        self.proxy.start()


@pytest.fixture
def broker(moto_server: str) -> Broker:
    return MotoKinesis(moto_server)


@pytest.fixture
def private_broker(moto_server: str) -> Iterator[PrivateBroker]:
    parts = urllib.parse.urlsplit(moto_server)
    assert parts.hostname is not None
    assert parts.port is not None
    proxy = Proxy((parts.hostname, parts.port))
    proxy.start()
    try:
        yield ProxiedKinesis(moto_server, proxy)
    finally:
        proxy.stop()


class TestKinesisContract(ProviderContract):
    """The contract on Kinesis (moto)."""


async def _first_starts(session: AsyncSession) -> list[str]:
    keys = await session.scalars(
        select(SourceCheckpoint.key).where(SourceCheckpoint.key.endswith("/@started"))
    )
    return list(keys)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
async def test_latest_on_a_quiet_stream_reads_after_a_kill_9_what_came_while_down(
    moto_server: str, tmp_path: Path, database_url: str
) -> None:
    """No event ever moved a position before the kill: the first start, stored when the
    watcher started, is where the restarted watcher reads the shards from."""
    source = await MotoKinesis(moto_server).source()
    await source.send([json.dumps({"i": -1})])  # before the first start: never read
    write_pipelines(tmp_path / "pipelines", watching(source, start="LATEST"))
    with daemon(tmp_path, database_url, source) as process:
        process.start()
        await process.wait_logged("pipelines_loaded")
        await wait_for(database_url, _first_starts, bool, timeout_s=60)
        process.signal(signal.SIGKILL)
        assert await process.wait(30) == -signal.SIGKILL
        await send_numbered(source, 0, 20, batch=5)  # while the daemon is down
        process.start()
        await wait_for(
            database_url, lambda s: event_count(s, "stream"), lambda n: n >= 20, timeout_s=120
        )
        events = await settled_events(process, database_url)
    assert numbers(events) == list(range(20))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
async def test_latest_on_a_stream_created_while_the_daemon_is_down_reads_its_first_record(
    moto_server: str, tmp_path: Path, database_url: str
) -> None:
    """The stream is missing at the watcher's first start (its error, looked for again within
    seconds); the daemon stops; the stream is created and written to; the daemon starts again.
    The first start was stored before the stream was looked for, so this start is not a first
    one, and ``LATEST`` reads from that first start: the first record is an event."""
    from aiobotocore.session import get_session

    stream = f"stream-{uuid.uuid4().hex[:12]}"
    uri = f"kinesis://{stream}?endpoint_url={moto_server}&region=us-east-1"
    source = Source(uri=uri, send=lambda bodies: send(uri, list(bodies)))
    write_pipelines(tmp_path / "pipelines", watching(source, start="LATEST", poll_interval_s=0.2))
    with daemon(tmp_path, database_url, source) as process:
        process.start()
        error = await failed_missing(process, database_url, times=1)
        process.signal(signal.SIGTERM)
        assert await process.wait(60) == 0, process.tail()
        async with get_session().create_client("kinesis", endpoint_url=moto_server) as client:
            await create_stream(client, stream, shards=2)
        await source.send([json.dumps({"i": 1})])
        process.start()
        await wait_for(database_url, lambda s: event_count(s, "stream"), lambda n: n >= 1)
        await source.send([json.dumps({"i": 2})])
        await wait_for(database_url, lambda s: event_count(s, "stream"), lambda n: n >= 2)
        events = await settled_events(process, database_url)
    assert f"Kinesis stream {stream!r} does not exist" in error
    assert numbers(events) == [1, 2]


SHARED_SHARDS = 4


async def _shard_holders(session: AsyncSession) -> dict[str, str]:
    """By shard lease (``kinesis/<stream>/<application>/<shard id>``), the instance holding it."""
    rows = await session.execute(
        select(Lease.name, Lease.owner).where(
            Lease.name.startswith("kinesis/"), Lease.name.not_like("%@member/%")
        )
    )
    return {name.rsplit("/", 1)[1]: owner for name, owner in rows}


def _by_pid(holders: dict[str, str]) -> Counter[int]:
    """How many shards each process holds (an instance id is ``host:pid:nonce``)."""
    return Counter(int(owner.split(":")[-2]) for owner in holders.values())


def _pid(process: DaemonProcess) -> int:
    assert process.process is not None
    return process.process.pid


@pytest.mark.timeout(300)
@pytest.mark.parametrize("db_backend", ["postgresql"], indirect=True)
async def test_two_daemons_share_the_shards_and_move_them_on_a_kill_9_and_a_stop(
    moto_server: str, tmp_path: Path, database_url: str
) -> None:
    """Two ``triggerer run`` on one PostgreSQL read a 4-shard stream, two shards each, under a
    lease per shard. One is killed (-9) while records flow: once its leases expire the other
    takes its shards and reads on from their stored positions. It starts again and gets two
    shards back; then the other is stopped (SIGTERM): it gives its shards up, taken at once.
    Every record is one event."""
    from aiobotocore.session import get_session

    stream = f"stream-{uuid.uuid4().hex[:12]}"
    async with get_session().create_client("kinesis", endpoint_url=moto_server) as client:
        await create_stream(client, stream, shards=SHARED_SHARDS)
    uri = f"kinesis://{stream}?endpoint_url={moto_server}&region=us-east-1"

    async def post(bodies: Sequence[str]) -> None:
        await send(uri, list(bodies))

    source = Source(uri=uri, send=post)
    write_pipelines(tmp_path / "pipelines", watching(source, poll_interval_s=0.2))
    first = daemon(tmp_path, database_url, source)
    config = Path(first.arguments[2])
    with first, DaemonProcess(first.env, tmp_path / "daemon-2.log", config) as second:
        first.start()
        second.start()
        await first.wait_logged("pipelines_loaded")
        await second.wait_logged("pipelines_loaded")
        holders = await wait_for(
            database_url,
            _shard_holders,
            lambda held: sorted(_by_pid(held).values()) == [2, 2] and len(held) == 4,
            timeout_s=60,
        )
        assert set(_by_pid(holders)) == {_pid(first), _pid(second)}
        await send_numbered(source, 0, 200, batch=20)
        await wait_for(database_url, lambda s: event_count(s, "stream"), lambda n: n >= 200)

        # kill -9 while records flow: its shards move once its leases expire.
        killed = _pid(second)
        async with anyio.create_task_group() as group:
            group.start_soon(partial(send_numbered, source, 200, 400, batch=10))
            await wait_for(database_url, lambda s: event_count(s, "stream"), lambda n: n >= 220)
            second.signal(signal.SIGKILL)
            assert await second.wait(30) == -signal.SIGKILL
        moved = await wait_for(
            database_url, _shard_holders, lambda held: _by_pid(held) == {_pid(first): 4}
        )
        assert killed not in _by_pid(moved)
        await send_numbered(source, 400, 500, batch=20)
        await wait_for(database_url, lambda s: event_count(s, "stream"), lambda n: n >= 500)

        # It starts again and gets its share back; the other stops cleanly and hands over.
        second.start()
        await wait_for(
            database_url,
            _shard_holders,
            lambda held: sorted(_by_pid(held).values()) == [2, 2] and len(held) == 4,
            timeout_s=60,
        )
        async with anyio.create_task_group() as group:
            group.start_soon(partial(send_numbered, source, 500, 700, batch=10))
            await wait_for(database_url, lambda s: event_count(s, "stream"), lambda n: n >= 520)
            first.signal(signal.SIGTERM)
            assert await first.wait(60) == 0, first.tail()
        await wait_for(
            database_url, _shard_holders, lambda held: _by_pid(held) == {_pid(second): 4}
        )
        await send_numbered(source, 700, 800, batch=20)
        await wait_for(database_url, lambda s: event_count(s, "stream"), lambda n: n >= 800)
        events = await settled_events(second, database_url)
        log_text = (tmp_path / "daemon-2.log").read_text()
    assert numbers(events) == list(range(800))
    assert '"kinesis_shards_held"' in log_text
