"""The shared harness of the daemon benchmarks (``bench_latency``, ``bench_spark``,
``bench_ingest``, ``bench_idle``, ``bench_idle_demo``, ``bench_fanout``, ``bench_listeners``)
and the providers' (``bench_sqs``, ``bench_nats``, ``bench_rabbitmq``, ``bench_kinesis``,
``bench_pubsub``, ``bench_mqtt``, ``bench_redis_streams``: one part each, on a server of its
own or the machine's RabbitMQ).

A benchmark script is a :class:`Bench`: its parts, sizes and options. :func:`main` starts a
tansu broker, lets the script prepare what its parts share (a pre-produced topic), then runs each
part in a child process of its own (clean memory and CPU figures, and metrics that start from
zero), prints the table and writes the JSON: ``{"meta": ..., "<part>": {...}, ...}``.

A part runs the daemon in its process with :func:`running` (``serve()``, as the e2e tests do,
with the servers it runs beside its parts being the harness's: that is how the part gets the
daemon's parts to read), or as ``triggerer run --config`` with :func:`triggerer_run`. What a
part sees of the daemon, it sees through :mod:`tests.benchmarks.observe`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import psycopg
from psycopg import sql

from deploy.local.services import tansu
from tests.benchmarks.report import publish
from triggerer.service.config import LoggingSettings, Settings
from triggerer.service.daemon.service import Service, serve
from triggerer.service.logs import configure_logging
from watchers import providers
from watchers.kafka import KafkaTrigger
from watchers.kafka import fetcher as kafka_fetcher

if TYPE_CHECKING:
    from deploy.local import services
    from triggerer.triggers import BaseEventTrigger

DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
GROUP_OPTIONS = "session_timeout_ms=6000, heartbeat_interval_ms=1000"
"""KafkaTrigger options of the benchmarks' pipelines: quick group joins."""
TRIGGERER = Path(sys.executable).with_name("triggerer")

Part = Callable[[argparse.Namespace, Path], Awaitable[dict[str, Any]]]
"""A part: ``(arguments, an empty folder of its own)`` to its figures."""


# -- the daemon


def daemon_settings(workdir: Path, database_url: str, **sections: dict[str, Any]) -> Settings:
    """The settings of a benchmark's daemon: its pipelines, logs and database, logging at
    WARNING; ``sections`` merged in (``spark={"mode": ...}``, ``runs=...``)."""
    settings: dict[str, dict[str, Any]] = {
        "database": {"url": database_url},
        "pipelines": {"dir": workdir / "pipelines"},
        "spark": {"logs_dir": workdir / "logs"},
        "logging": {"level": "WARNING"},
        # On, so that serve() hands its parts to the harness (see running()); the harness's
        # server binds no port.
        "api": {"enabled": True},
    }
    for name, values in sections.items():
        settings.setdefault(name, {}).update(values)
    return Settings.model_validate(settings)


class Daemon:
    """A daemon running in this process: its parts, as ``serve()`` hands them to the servers
    it runs beside them (where the REST API goes), for reading."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self._fetchers: kafka_fetcher.Fetchers | None = None

    async def run(self) -> None:
        """Started by ``serve()`` in the daemon's context, where its Kafka watchers' shared
        consumers are."""
        self._fetchers = kafka_fetcher.current()

    def stop(self) -> None:
        """Called by ``serve()`` on shutdown: nothing to stop."""

    def triggers(self) -> list[BaseEventTrigger]:
        return [watched.trigger for watched in self.service.registry.triggers.values()]

    def kafka_triggers(self) -> list[KafkaTrigger]:
        return [t for t in self.triggers() if isinstance(t, KafkaTrigger)]

    async def wait_assigned(self, timeout_s: float = 120.0) -> None:
        """Until every KafkaTrigger owns its partitions (group joins are not notified: polled)."""
        with anyio.fail_after(timeout_s):
            while not all(t.assignment for t in self.kafka_triggers()):  # noqa: ASYNC110
                await anyio.sleep(0.1)

    def messages_fetched(self) -> int:
        """Messages fetched from the broker: by the shared consumers, each counted once, or
        else by the KafkaTriggers' own consumers."""
        shared = sum(fetcher.fetched for fetcher in self._fetchers or ())
        return shared or sum(t.messages for t in self.kafka_triggers())


def import_providers() -> None:
    """Import what a daemon imports as it starts: every installed queue provider (the AWS
    client among them). Code, not watchers: a part that counts the daemon's memory or CPU
    from before its start calls this first, so its first daemon is not charged for it."""
    providers.installed()


@contextlib.asynccontextmanager
async def running(
    settings: Settings, daemon: Callable[[Service], Daemon] = Daemon
) -> AsyncIterator[Daemon]:
    """``serve(settings)`` in the background of the ``async with`` body, then its shutdown;
    ``daemon`` makes what it hands its parts to (a :class:`Daemon` that also serves the API)."""
    if not settings.api.enabled:
        raise ValueError("[api] enabled = false: serve() would not hand its parts to the harness")
    daemons: list[Daemon] = []

    def beside(service: Service) -> Daemon:
        daemons.append(daemon(service))
        return daemons[-1]

    stop = anyio.Event()
    async with anyio.create_task_group() as group:
        await group.start(partial(serve, settings, api=beside, shutdown_trigger=stop.wait))
        try:
            yield daemons[0]
        finally:
            stop.set()


async def triggerer_run(
    config: Path, env: Mapping[str, str], cwd: Path, log_path: Path
) -> anyio.abc.Process:
    """``triggerer run --config CONFIG`` as a process of its own, logging to ``log_path``."""
    with log_path.open("ab") as log:
        return await anyio.open_process(
            [str(TRIGGERER), "run", "--config", str(config)], cwd=cwd, env=dict(env), stderr=log
        )


# -- databases


@contextlib.contextmanager
def database(backend: str, workdir: Path, pg_url: str, name: str) -> Iterator[str]:
    """A fresh, empty database URL: a SQLite file, or a ``bench_<uuid>`` PostgreSQL database
    dropped afterwards."""
    if backend == "sqlite":
        yield f"sqlite:///{workdir / f'{name}.db'}"
        return
    database_name = f"bench_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database_name)))
    try:
        yield pg_url.rsplit("/", 1)[0] + f"/{database_name}"
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(database_name)
                )
            )


# -- the scripts


def on_server(
    server: Callable[[Path], services.Service],
    measure: Callable[[services.Service, argparse.Namespace], Awaitable[dict[str, Any]]],
    *,
    start_timeout_s: float = 30.0,
) -> Part:
    """A part that measures on a server of its own (``server(folder)``), stopped after."""

    async def part(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
        started = server(folder)
        started.start(timeout_s=start_timeout_s)
        try:
            return await measure(started, args)
        finally:
            started.stop()

    return part


@dataclass(frozen=True)
class Bench:
    """One benchmark script."""

    module: str
    """Its module, ``tests.benchmarks.bench_...``: each part runs as ``python -m`` of it."""
    description: str
    parts: Mapping[str, Part]
    full: Mapping[str, int | float]
    """Its sizes, as options (``--latency-messages``); ``--quick`` takes :attr:`quick`'s."""
    quick: Mapping[str, int | float]
    goals: Mapping[str, float] = field(default_factory=dict)
    options: Callable[[argparse.ArgumentParser], None] | None = None
    """Adds the script's own options."""
    prepare: Callable[[argparse.Namespace, dict[str, Any]], Awaitable[None]] | None = None
    """Runs once the broker is up, before the parts: may set ``arguments.topic`` (passed on to
    every part) and add to the meta figures."""


def main(bench: Bench, argv: list[str] | None = None) -> None:
    """The script's command line: every part (or ``--parts``), or one part in this process."""
    argv = sys.argv[1:] if argv is None else argv
    args = _parse(bench, argv)
    configure_logging(LoggingSettings(level="WARNING", format="console"))
    if args.part:
        with tempfile.TemporaryDirectory(prefix=f"{args.part}-") as folder:
            result = anyio.run(bench.parts[args.part], args, Path(folder))
        args.part_out.write_text(json.dumps(result, indent=2) + "\n")
        return
    results = _run_all(bench, args, argv)
    publish(results, args.out)
    if any("error" in value for value in results.values()):
        sys.exit(1)


def _run_all(bench: Bench, args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "sizes": {name: getattr(args, name) for name in bench.full},
        **({"goals": dict(bench.goals)} if bench.goals else {}),
    }
    results: dict[str, Any] = {"meta": meta}
    with tempfile.TemporaryDirectory(prefix="bench-") as folder:
        broker = tansu(Path(folder))
        broker.start()
        args.bootstrap = broker.address
        try:
            if bench.prepare is not None:
                anyio.run(bench.prepare, args, meta)
            for part in args.parts:
                sys.stdout.write(f"-- {part}\n")
                sys.stdout.flush()
                out = Path(folder) / f"{part}.json"
                child = [sys.executable, "-m", bench.module, *argv, "--part", part]
                child += ["--part-out", str(out), "--bootstrap", broker.address]
                child += ["--topic", args.topic or ""]
                started = time.perf_counter()
                done = subprocess.run(child, check=False)  # noqa: S603 - this script
                if done.returncode:
                    results[part] = {"error": f"exit code {done.returncode} (see stderr above)"}
                else:
                    results[part] = json.loads(out.read_text())
                results[part]["part_wall_s"] = round(time.perf_counter() - started, 1)
        finally:
            broker.stop()
    meta["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return results


def _parse(bench: Bench, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=bench.description)
    short = bench.module.rsplit(".", 1)[-1]
    parser.add_argument("--out", type=Path, default=Path(f"{short}.json"))
    parser.add_argument(
        "--quick", action="store_true", help="small sizes: " + json.dumps(bench.quick)
    )
    parser.add_argument("--parts", nargs="+", choices=list(bench.parts), default=list(bench.parts))
    for name, full in bench.full.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(full), help=f"(full {full})")
    if bench.options is not None:
        bench.options(parser)
    parser.add_argument("--part", choices=list(bench.parts), help=argparse.SUPPRESS)
    parser.add_argument("--part-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in bench.full:
        if getattr(args, name) is None:
            setattr(args, name, (bench.quick if args.quick else bench.full)[name])
    return args
