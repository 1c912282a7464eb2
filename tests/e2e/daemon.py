"""Running the daemon in-process for end-to-end tests, and reading what it stored."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import anyio
from aiokafka import AIOKafkaProducer
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from triggerer.service.api.server import api_server
from triggerer.service.config import Settings
from triggerer.service.daemon.service import serve
from triggerer.service.store import create_engine, models, session_factory

T = TypeVar("T")

WAIT_TIMEOUT_S = 120.0
"""How long :func:`wait_for` waits unless told otherwise."""


def kafka_asset_source(asset: str) -> str:
    """The head of a pipelines source: the imports, and the asset ``asset`` (a variable of the
    same name) that gets an event for each message of the test's topic. ``{bootstrap}`` and
    ``{topic}`` are left to fill in, as :meth:`Deployment.write_pipelines` does."""
    return f"""
    from triggerer import Asset, AssetWatcher, BaseEventTrigger, Metadata, pipeline
    from watchers import KafkaTrigger

    {asset} = Asset("{asset}", watchers=[AssetWatcher("{asset}_topic", KafkaTrigger(
        bootstrap_servers="{{bootstrap}}", topics=["{{topic}}"],
        session_timeout_ms=6000, heartbeat_interval_ms=1000))])
"""


ORDERS = kafka_asset_source("orders")
"""Pipelines source head with the asset ``orders``, fed by the test's topic."""


def sqlite_url(tmp_path: Path) -> str:
    """The database of a test's daemon: a new SQLite file in ``tmp_path``."""
    return f"sqlite:///{tmp_path / 'triggerer.db'}"


def write_pipelines(folder: Path, source: str, name: str = "pipelines.py") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(textwrap.dedent(source))
    return path


def daemon_settings(tmp_path: Path, database_url: str, spark_remote: str) -> Settings:
    return Settings.model_validate(
        {
            "database": {"url": database_url},
            "pipelines": {"dir": tmp_path / "pipelines", "reload_interval_s": 0.2},
            "spark": {"mode": "connect", "remote": spark_remote, "logs_dir": tmp_path / "logs"},
            "daemon": {"heartbeat_interval_s": 0.5, "shutdown_grace_s": 30},
            # Served only where a test asks: a fixed port would clash between daemons.
            "api": {"enabled": False},
        }
    )


@asynccontextmanager
async def running_daemon(settings: Settings) -> AsyncIterator[None]:
    """The daemon runs in the background of the ``async with`` body, then shuts down."""
    stop = anyio.Event()
    async with anyio.create_task_group() as group:
        await group.start(partial(serve, settings, api=api_server, shutdown_trigger=stop.wait))
        try:
            yield
        finally:
            stop.set()


async def query(database_url: str, work: Callable[[AsyncSession], Awaitable[T]]) -> T:
    engine = create_engine(database_url)
    try:
        async with session_factory(engine)() as session:
            return await work(session)
    finally:
        await engine.dispose()


async def wait_for(
    database_url: str,
    work: Callable[[AsyncSession], Awaitable[T]],
    done: Callable[[T], bool],
    *,
    timeout_s: float = WAIT_TIMEOUT_S,
) -> T:
    """Poll ``work`` until ``done(result)``; fail after ``timeout_s``."""
    with anyio.fail_after(timeout_s):
        while True:
            result = await query(database_url, work)
            if done(result):
                return result
            await anyio.sleep(0.2)


async def runs(session: AsyncSession) -> list[models.Run]:
    return list((await session.scalars(select(models.Run).order_by(models.Run.id))).all())


async def events_of(session: AsyncSession, name: str) -> list[models.AssetEvent]:
    rows = await session.scalars(
        select(models.AssetEvent)
        .join(models.Asset, models.Asset.id == models.AssetEvent.asset_id)
        .where(models.Asset.name == name)
        .order_by(models.AssetEvent.id)
    )
    return list(rows.all())


async def consumed(session: AsyncSession) -> dict[str, list[int]]:
    rows = await session.execute(
        select(models.Run.run_id, models.RunEvent.event_id)
        .join(models.RunEvent, models.RunEvent.run_pk == models.Run.id)
        .order_by(models.RunEvent.event_id)
    )
    result: dict[str, list[int]] = {}
    for run_id, event_id in rows.all():
        result.setdefault(run_id, []).append(event_id)
    return result


def states(all_runs: list[models.Run]) -> dict[str, Any]:
    return {run.run_id: run.state for run in all_runs}


# -- Helpers of the failure and crash tests ---------------------------------------------------

TRIGGERER_BIN = Path(sys.executable).with_name("triggerer")
"""The console script of this virtualenv: the daemon and the CLI as users start them."""

ACTIVE_RUN_STATES = ("queued", "running", "up_for_retry")


async def produce_json(
    bootstrap: str, topic: str, values: Iterable[Any], *, batch: int = 0, pause_s: float = 0.0
) -> None:
    """Send each value as a JSON message; with ``batch``, pause ``pause_s`` after every
    ``batch`` messages so they keep flowing for a while instead of arriving in one burst."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        pending = []
        for sent, value in enumerate(values, start=1):
            pending.append(await producer.send(topic, json.dumps(value).encode()))
            if batch and sent % batch == 0:
                await producer.flush()
                await anyio.sleep(pause_s)  # pacing the traffic, not waiting for a result
        for delivery in pending:
            await delivery
    finally:
        await producer.stop()


async def pipeline_row(session: AsyncSession, pipeline_id: str) -> models.Pipeline | None:
    return await session.get(models.Pipeline, pipeline_id)


async def trigger_rows(session: AsyncSession) -> list[models.Trigger]:
    return list((await session.scalars(select(models.Trigger).order_by(models.Trigger.id))).all())


async def queued_events(session: AsyncSession, pipeline_id: str) -> list[int]:
    """Event ids waiting in the queue of ``pipeline_id``."""
    rows = await session.scalars(
        select(models.QueuedEvent.event_id)
        .where(models.QueuedEvent.pipeline_id == pipeline_id)
        .order_by(models.QueuedEvent.event_id)
    )
    return list(rows.all())


async def event_count(session: AsyncSession, name: str) -> int:
    count = await session.scalar(
        select(func.count())
        .select_from(models.AssetEvent)
        .join(models.Asset, models.Asset.id == models.AssetEvent.asset_id)
        .where(models.Asset.name == name)
    )
    return count or 0


async def consumed_by(session: AsyncSession, pipeline_id: str) -> list[int]:
    """Event ids consumed by the runs of ``pipeline_id``, one entry per ``run_event`` row."""
    rows = await session.scalars(
        select(models.RunEvent.event_id)
        .where(models.RunEvent.pipeline_id == pipeline_id)
        .order_by(models.RunEvent.event_id)
    )
    return list(rows.all())


async def settled(session: AsyncSession, pipeline_id: str) -> tuple[int, int]:
    """(active runs, queued events) of ``pipeline_id``: both 0 once it has caught up."""
    active = await session.scalar(
        select(func.count())
        .select_from(models.Run)
        .where(models.Run.pipeline_id == pipeline_id, models.Run.state.in_(ACTIVE_RUN_STATES))
    )
    return active or 0, len(await queued_events(session, pipeline_id))


def daemon_env(
    tmp_path: Path, database_url: str, spark_remote: str, **extra: str
) -> dict[str, str]:
    """The environment of a ``triggerer`` process configured like :func:`daemon_settings`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIGGERER_")}
    return env | {
        "TRIGGERER_DATABASE__URL": database_url,
        "TRIGGERER_PIPELINES__DIR": str(tmp_path / "pipelines"),
        "TRIGGERER_PIPELINES__RELOAD_INTERVAL_S": "0.2",
        "TRIGGERER_SPARK__MODE": "connect",
        "TRIGGERER_SPARK__REMOTE": spark_remote,
        "TRIGGERER_SPARK__LOGS_DIR": str(tmp_path / "logs"),
        "TRIGGERER_DAEMON__HEARTBEAT_INTERVAL_S": "0.5",
        "TRIGGERER_LOGGING__FORMAT": "json",
        "TRIGGERER_API__ENABLED": "false",
        **extra,
    }


def local_config(
    tmp_path: Path, mode: str, *, conf: dict[str, str] | None = None, **spark: str
) -> Path:
    """A config file for ``triggerer run --config`` (and the CLI's): SQLite in ``tmp_path``,
    Spark in ``mode`` on its default master (``local[*]``) with ``conf``, and ``spark``
    settings."""
    settings: dict[str, dict[str, Any]] = {
        "database": {"url": sqlite_url(tmp_path)},
        "pipelines": {"dir": str(tmp_path / "pipelines"), "reload_interval_s": 0.2},
        "spark": {"mode": mode, "logs_dir": str(tmp_path / "logs"), **spark},
        "spark.conf": conf or {},
        "daemon": {"heartbeat_interval_s": 0.5},
        "logging": {"format": "json"},
        "api": {"enabled": False},
    }
    return write_config(tmp_path / "triggerer.toml", settings)


def write_config(path: Path, sections: dict[str, dict[str, Any]]) -> Path:
    """``path`` written as a config file of ``sections`` (``{"spark.conf": {...}}`` for the
    table ``[spark.conf]``), each value as JSON, which TOML reads alike for strings, numbers
    and booleans."""
    lines = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        lines += [f"{json.dumps(key)} = {json.dumps(value)}" for key, value in values.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def without_triggerer_variables() -> dict[str, str]:
    """The environment of a process that reads only its ``--config``."""
    return {k: v for k, v in os.environ.items() if not k.startswith("TRIGGERER_")}


class DaemonProcess:
    """``triggerer run`` as a real process; its output goes to ``log_path``.

    ``with DaemonProcess(...) as daemon:`` kills the process if it still runs at the end.
    ``cwd`` is its working directory (what relative paths of its config start from).
    """

    def __init__(
        self,
        env: dict[str, str],
        log_path: Path,
        config: Path | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.env = env
        self.log_path = log_path
        self.arguments = ["run", "--config", str(config)] if config else ["run"]
        self.cwd = cwd
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> DaemonProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        with self.log_path.open("ab") as log_file:
            self.process = subprocess.Popen(  # noqa: S603 - a fixed argv of our own binary
                [str(TRIGGERER_BIN), *self.arguments],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
            )

    def signal(self, signum: int) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    async def wait(self, timeout_s: float) -> int:
        """The exit code; fails when the process is still running after ``timeout_s``."""
        assert self.process is not None
        try:
            return await anyio.to_thread.run_sync(self.process.wait, timeout_s)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"triggerer still running after {timeout_s}s{self.tail()}") from None

    async def wait_logged(
        self, event: str, timeout_s: float = 60.0, *, times: int = 1
    ) -> list[dict[str, Any]]:
        """Wait until the daemon has logged ``event`` (JSON logs), e.g. ``pipelines_loaded``,
        ``times`` times; those log records."""
        needle = f'"event": "{event}"'
        with anyio.fail_after(timeout_s):
            while True:
                text = await anyio.Path(self.log_path).read_text(errors="replace")
                records = [json.loads(line) for line in text.splitlines() if needle in line]
                if len(records) >= times:
                    return records
                assert self.process is not None
                assert self.process.poll() is None, f"triggerer exited{self.tail()}"
                await anyio.sleep(0.1)

    def stop(self) -> None:
        """Kill the process if it still runs (test teardown)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        return f"\n--- {self.log_path} ---\n" + "\n".join(text)


def stat_fields(stat: Path) -> list[str]:
    """The fields of a ``/proc/.../stat`` file after the command's name: state, parent pid,
    ... (``proc(5)``); OSError once the process is gone."""
    return stat.read_text().rsplit(")", 1)[1].split()


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def triggerer_cli(env: dict[str, str], *arguments: str) -> subprocess.CompletedProcess[bytes]:
    """Run ``triggerer ARGUMENTS`` as a process; its ``CompletedProcess``."""
    return await anyio.run_process([str(TRIGGERER_BIN), *arguments], env=env, check=False)


# -- One test's setup ------------------------------------------------------------------------


@dataclass(frozen=True)
class Deployment:
    """What the daemon of one test works with: its pipelines folder, Spark logs and log file in
    ``tmp_path``, its database, its Spark Connect server, and the Kafka topic it watches."""

    tmp_path: Path
    database_url: str
    spark_remote: str
    bootstrap: str
    topic: str

    def write_pipelines(self, source: str, name: str = "pipelines.py") -> Path:
        """Write ``source`` into the pipelines folder, ``{bootstrap}`` and ``{topic}`` filled in."""
        formatted = source.format(bootstrap=self.bootstrap, topic=self.topic)
        return write_pipelines(self.tmp_path / "pipelines", formatted, name)

    def running(self) -> AbstractAsyncContextManager[None]:
        """The daemon in this process for the body of ``async with``: see :func:`running_daemon`."""
        return running_daemon(daemon_settings(self.tmp_path, self.database_url, self.spark_remote))

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a ``triggerer`` process: see :func:`daemon_env`."""
        return daemon_env(self.tmp_path, self.database_url, self.spark_remote, **extra)

    def process(self, **extra_env: str) -> DaemonProcess:
        """The daemon as a process, not started yet, logging to ``daemon.log``."""
        return DaemonProcess(self.env(**extra_env), self.tmp_path / "daemon.log")

    def config_file(self, **sections: dict[str, object]) -> Path:
        """A config file like :meth:`env`'s settings, ``sections`` merged in: for
        ``triggerer run --config FILE`` and the CLI's ``--config``."""
        settings: dict[str, dict[str, object]] = {
            key.removeprefix("TRIGGERER_").split("__")[0].lower(): {}
            for key in self.env()
            if key.startswith("TRIGGERER_")
        }
        for key, value in self.env().items():
            if key.startswith("TRIGGERER_"):
                section, name = key.removeprefix("TRIGGERER_").lower().split("__")
                settings[section][name] = value
        for section, values in sections.items():
            settings.setdefault(section, {}).update(values)
        return write_config(self.tmp_path / "triggerer.toml", settings)

    def process_with_config(self, config: Path, cwd: Path | None = None) -> DaemonProcess:
        """``triggerer run --config CONFIG`` as a process (no TRIGGERER_ variables) in
        ``cwd`` (default: this one), not started yet, logging to ``daemon.log``."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRIGGERER_")}
        return DaemonProcess(env, self.tmp_path / "daemon.log", config, cwd)

    async def produce(self, values: Iterable[Any], *, batch: int = 0, pause_s: float = 0.0) -> None:
        """Send ``values`` to the topic: see :func:`produce_json`."""
        await produce_json(self.bootstrap, self.topic, values, batch=batch, pause_s=pause_s)

    async def query(self, work: Callable[[AsyncSession], Awaitable[T]]) -> T:
        return await query(self.database_url, work)

    async def wait_for(
        self,
        work: Callable[[AsyncSession], Awaitable[T]],
        done: Callable[[T], bool],
        *,
        timeout_s: float = WAIT_TIMEOUT_S,
    ) -> T:
        """Poll the database until ``done``: see :func:`wait_for`."""
        return await wait_for(self.database_url, work, done, timeout_s=timeout_s)

    async def start_watching(self, daemon: DaemonProcess) -> None:
        """Start ``daemon`` and wait until its one watcher's row says ``running``."""
        daemon.start()
        await daemon.wait_logged("pipelines_loaded")
        await self.wait_for(trigger_rows, lambda rows: rows[0].state == "running", timeout_s=60)
