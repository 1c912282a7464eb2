"""One daemon, many pipelines: what holding 10,000 pipelines costs, beside 1,000.

    python -m tests.benchmarks.bench_scale --out bench_scale.json [--quick] [--parts ...]

Each part is ``triggerer run --config FILE`` (local Spark, ``[runs] parallelism`` 2) on SQLite or
PostgreSQL over N pipelines in 20 files, as a platform team holds them: a tenth waiting on a
partial AND (an event queued on its first asset, none on its second), a fifth on a daily cron,
10 ``per_event`` pipelines on one Kafka-watched asset (the hot one), the rest on assets watched by
N/20 watchers (four in five Kafka topics on the harness's tansu, one in five SQS queues on a moto
of the part's own). What it measures, in this order:

- ``idle_cpu_percent``: the daemon's process (its Spark server and run forker are processes of
  their own) over ``--idle-seconds`` once it settled, from ``/proc``; and its RSS. Beside it,
  after the daemon stopped, ``kafka_floor_cpu_percent``: plain aiokafka consumers of the same
  topics with the same fetch waits (the hot topic's is 10 ms, for its latency), and what the
  daemon costs beyond that floor.
- ``reload_s``: a pipeline added to one of the 20 files, to its row in the store.
- ``list_cli_s`` / ``list_api_all_ms``: ``triggerer pipelines list`` as a command (its first
  page, as a user types it), and every pipeline through ``GET /api/v1/pipelines`` (pages of
  1,000), wall time.
- ``sweep_ms``: the scheduler's safety sweep over the store as the part left it (every pipeline
  worth a look found, none of which has a run to make), in this process, median of 5.
- ``produce_to_run_ms``: ``--messages`` messages produced one at a time to the hot topic, each
  starting 10 runs: produce to each run's ``created_at``, p50 and p99 over every run.

Goals (issue 32): idle CPU <= 2 % of a core, produce to run p99 <= 50 ms, reload <= 2 s,
``pipelines list`` <= 0.6 s; the 1,000-pipeline parts show what grows.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import httpx

if __package__ in (None, ""):  # run as a script: put the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from aiokafka import AIOKafkaProducer
from sqlalchemy import bindparam, func, select

from deploy.local.services import DUMMY_AWS_ENV, free_port, moto
from tests.benchmarks import baselines
from tests.benchmarks.bench_kafka import create_topics
from tests.benchmarks.harness import TRIGGERER, Bench, database, main, triggerer_run
from tests.benchmarks.stats import percentile, process_rss_mb, thread_activity
from triggerer.service.loader import load_pipelines
from triggerer.service.scheduling.registry import sync_definitions
from triggerer.service.scheduling.scheduler import Scheduler
from triggerer.service.store import create_engine, models, session_factory

GOALS = {
    "idle_cpu_percent": 2.0,
    "produce_to_run_p99_ms": 50.0,
    "reload_s": 2.0,
    "list_cli_s": 0.6,
}
FILES = 20
HOT_PIPELINES = 10
START_TIMEOUT_S = 600.0
SETTLE_S = 30.0
"""Past the Spark server's start, the watchers' first polls and the consumer's group join."""
SWEEPS = 5

TEAM_FILE = """
from triggerer import Asset, AssetWatcher, pipeline
from watchers import KafkaTrigger, SqsTrigger

PREFIX = {prefix!r}


def watched(number):
    if number == {hot}:  # latency matters here: a consumer of its own, fetching every 10 ms
        trigger = KafkaTrigger(
            bootstrap_servers={bootstrap!r}, topics=[f"{{PREFIX}}-{{number}}"], fetch_max_wait_ms=10
        )
    elif number % 5:
        trigger = KafkaTrigger(bootstrap_servers={bootstrap!r}, topics=[f"{{PREFIX}}-{{number}}"])
    else:
        trigger = SqsTrigger(
            queue=f"{{PREFIX}}-{{number}}", region_name="us-east-1", endpoint_url={endpoint!r}
        )
    return Asset(f"watched_{{number}}", watchers=[AssetWatcher("source", trigger)])


def work(spark, context):
    pass


WATCHED = [watched(number) for number in range({watchers})]
"""

HOT = 1
"""The watched asset of the per-event pipelines: a Kafka topic."""


def pipeline_line(number: int, count: int, watchers: int) -> str:
    """The definition of pipeline ``number`` of ``count``."""
    ands, crons = count // 10, count // 5
    options = ""
    if number < ands:
        schedule = f'Asset("and_{number}_a") & Asset("and_{number}_b")'
    elif number < ands + crons:
        schedule = f'"{number % 60} {number % 24} * * *"'
    elif number < ands + crons + HOT_PIPELINES:
        schedule, options = f"WATCHED[{HOT}]", ', run_policy="per_event"'
    else:  # the hot asset's pipelines are the per-event ones alone
        schedule = f"WATCHED[{number % watchers if number % watchers != HOT else 0}]"
    return f'p{number} = pipeline(pipeline_id="p{number}", schedule={schedule}{options})(work)'


def write_pipelines(folder: Path, count: int, bootstrap: str, endpoint: str, prefix: str) -> None:
    """The ``count`` pipelines in :data:`FILES` files of ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    watchers = count // 20
    per_file = count // FILES
    for file in range(FILES):
        head = TEAM_FILE.format(
            prefix=prefix, bootstrap=bootstrap, endpoint=endpoint, watchers=watchers, hot=HOT
        )
        lines = [
            pipeline_line(number, count, watchers)
            for number in range(file * per_file, (file + 1) * per_file)
        ]
        (folder / f"team_{file:02}.py").write_text(head + "\n" + "\n".join(lines) + "\n")


async def create_queues(endpoint: str, names: list[str]) -> None:
    from aiobotocore.session import get_session

    async with get_session().create_client(
        "sqs", endpoint_url=endpoint, region_name="us-east-1"
    ) as client:
        for name in names:
            await client.create_queue(QueueName=name)


def config_file(workdir: Path, database_url: str, api_port: int) -> Path:
    path = workdir / "triggerer.toml"
    path.write_text(
        "\n".join(
            [
                "[database]",
                f"url = {json.dumps(database_url)}",
                "[pipelines]",
                f"dir = {json.dumps(str(workdir / 'pipelines'))}",
                "reload_interval_s = 0.5",
                "[api]",
                "enabled = true",
                f"port = {api_port}",
                "[spark]",
                'mode = "local"',
                'master = "local[1]"',
                f"logs_dir = {json.dumps(str(workdir / 'logs'))}",
                "[runs]",
                "parallelism = 2",
                "[logging]",
                'level = "WARNING"',
                'format = "json"',
            ]
        )
        + "\n"
    )
    return path


async def stored_pipelines(database_url: str) -> int:
    engine = create_engine(database_url)
    try:
        async with session_factory(engine)() as session:
            return await session.scalar(select(func.count()).select_from(models.Pipeline)) or 0
    finally:
        await engine.dispose()


async def wait_for(check: Any, timeout_s: float, what: str) -> float:
    """Poll ``check()`` until true; the seconds it took."""
    started = time.perf_counter()
    while not await check():
        if time.perf_counter() - started > timeout_s:
            raise TimeoutError(f"{what}: not within {timeout_s} s")
        await anyio.sleep(0.05)
    return time.perf_counter() - started


async def sweep_ms(database_url: str, folder: Path) -> float:
    """The median time of the scheduler's full look (as at start and each sweep)."""
    engine = create_engine(database_url)
    try:
        sessions = session_factory(engine)
        loaded = await anyio.to_thread.run_sync(load_pipelines, folder)
        async with sessions.begin() as session:
            registry = await sync_definitions(session, loaded)
        scheduler = Scheduler(sessions, lambda: registry, lambda: None)
        await scheduler.run_once()  # the first: tidies the queue for these definitions
        passes = []
        for _ in range(SWEEPS):
            scheduler.wake()
            started = time.perf_counter()
            await scheduler.run_once()
            passes.append(time.perf_counter() - started)
    finally:
        await engine.dispose()
    return round(percentile(passes, 50) * 1000, 1)


async def produce_to_runs(
    args: argparse.Namespace, topic: str, database_url: str, count: int
) -> list[float]:
    """Produce ``--messages`` messages one at a time, each once the runs of the one before
    were made; from its produce to the ``created_at`` of each of its runs."""
    engine = create_engine(database_url)
    sessions = session_factory(engine)
    producer = AIOKafkaProducer(bootstrap_servers=args.bootstrap, linger_ms=0)
    await producer.start()
    latencies = []
    try:
        async with sessions() as session:
            last = await session.scalar(select(func.coalesce(func.max(models.Run.id), 0)))
        first_hot = count // 10 + count // 5
        hot = [f"p{number}" for number in range(first_hot, first_hot + HOT_PIPELINES)]
        newer = select(models.Run.id, models.Run.created_at).where(
            models.Run.id > bindparam("last"), models.Run.pipeline_id.in_(hot)
        )
        for number in range(args.messages):
            produced = time.time()
            await producer.send_and_wait(topic, json.dumps({"n": number}).encode())
            runs: list[Any] = []

            async def all_made(last: int = last or 0) -> bool:
                nonlocal runs
                async with sessions() as session:
                    runs = list((await session.execute(newer, {"last": last})).all())
                return len(runs) >= HOT_PIPELINES

            await wait_for(all_made, 60.0, f"the runs of message {number}")
            latencies += [(at.timestamp() - produced) * 1000 for _, at in runs]
            last = max(run_id for run_id, _ in runs)
            await anyio.sleep(args.message_gap_s)
    finally:
        await producer.stop()
        await engine.dispose()
    return latencies


async def post_waiting_events(api: str, count: int) -> None:
    """An event on the first asset of each partial AND."""
    async with httpx.AsyncClient(base_url=api, timeout=30) as client:
        for number in range(count // 10):
            answer = await client.post(
                "/api/v1/assets/events", json={"uri": f"and_{number}_a", "extra": {}}
            )
            answer.raise_for_status()


async def list_api_ms(api: str, count: int) -> float:
    """``GET /api/v1/pipelines``, page after page of 1,000, until every pipeline was read."""
    started = time.perf_counter()
    seen = 0
    async with httpx.AsyncClient(base_url=api, timeout=60) as client:
        while seen < count:
            page = await client.get("/api/v1/pipelines", params={"limit": 1000, "offset": seen})
            page.raise_for_status()
            if not page.json():
                raise AssertionError(f"GET /pipelines ended after {seen} of {count}")
            seen += len(page.json())
    return round((time.perf_counter() - started) * 1000, 1)


async def part_scale(
    args: argparse.Namespace, workdir: Path, backend: str, count: int
) -> dict[str, Any]:
    sqs = moto(workdir)
    sqs.start()
    endpoint = f"http://{sqs.address}"
    os.environ.update(DUMMY_AWS_ENV)
    prefix = f"scale-{uuid.uuid4().hex[:8]}"
    watchers = count // 20
    kafka_topics = [f"{prefix}-{n}" for n in range(watchers) if n % 5]
    for first in range(0, len(kafka_topics), 250):
        await create_topics(args.bootstrap, kafka_topics[first : first + 250], 1)
    await create_queues(endpoint, [f"{prefix}-{n}" for n in range(watchers) if not n % 5])
    folder = workdir / "pipelines"
    write_pipelines(folder, count, args.bootstrap, endpoint, prefix)
    api_port = free_port()
    api = f"http://127.0.0.1:{api_port}"
    result: dict[str, Any] = {"pipelines": count, "watchers": watchers, "backend": backend}
    env = {**os.environ, **DUMMY_AWS_ENV}
    if args.daemon_path:  # another checkout's daemon, to compare with, run alongside
        env["PYTHONPATH"] = str(args.daemon_path)
        result["daemon_path"] = str(args.daemon_path)
    try:
        with database(backend, workdir, args.pg_url, "scale") as database_url:
            config = config_file(workdir, database_url, api_port)
            started = time.perf_counter()
            daemon = await triggerer_run(config, env, workdir, workdir / "daemon.log")
            try:

                async def serving() -> bool:
                    try:
                        async with httpx.AsyncClient(timeout=5) as client:
                            return (await client.get(f"{api}/api/v1/readyz")).status_code == 200
                    except httpx.HTTPError:
                        return False

                await wait_for(serving, START_TIMEOUT_S, "the API")
                result["start_s"] = round(time.perf_counter() - started, 1)
                await post_waiting_events(api, count)
                await anyio.sleep(SETTLE_S)
                before, wall = thread_activity(daemon.pid), time.time()
                await anyio.sleep(args.idle_seconds)
                after, seconds = thread_activity(daemon.pid), time.time() - wall
                both = [thread for thread in after if thread in before]
                busy_s = sum(after[t][1] - before[t][1] for t in both) / os.sysconf("SC_CLK_TCK")
                result["idle_seconds"] = round(seconds, 1)
                result["idle_cpu_percent"] = round(100 * busy_s / seconds, 2)
                result["rss_mb"] = round(process_rss_mb(daemon.pid), 1)

                changed = folder / "team_07.py"
                changed.write_text(
                    changed.read_text()
                    + '\nadded = pipeline(pipeline_id="added", schedule=WATCHED[0])(work)\n'
                )

                async def added() -> bool:
                    return await stored_pipelines(database_url) == count + 1

                result["reload_s"] = round(await wait_for(added, 120.0, "the reload"), 2)

                listed = time.perf_counter()
                await anyio.run_process(
                    [str(TRIGGERER), "pipelines", "list", "--config", str(config)], env=env
                )
                result["list_cli_s"] = round(time.perf_counter() - listed, 2)
                result["list_api_all_ms"] = await list_api_ms(api, count + 1)

                latencies = await produce_to_runs(args, f"{prefix}-{HOT}", database_url, count)
                result["runs_measured"] = len(latencies)
                result["produce_to_run_p50_ms"] = round(percentile(latencies, 50), 1)
                result["produce_to_run_p99_ms"] = round(percentile(latencies, 99), 1)
                result["produce_to_run_max_ms"] = round(max(latencies), 1)
            finally:
                daemon.terminate()
                with anyio.fail_after(120):
                    await daemon.wait()
            if not args.daemon_path:  # this checkout's scheduler, in this process
                result["sweep_ms"] = await sweep_ms(database_url, folder)
        idle_topics = [topic for topic in kafka_topics if topic != f"{prefix}-{HOT}"]
        floor = await baselines.idle_consumer_cpu_percent(
            args.bootstrap, idle_topics, args.idle_seconds, fast_topics=[f"{prefix}-{HOT}"]
        )
        result["kafka_floor_cpu_percent"] = round(floor, 2)
        result["idle_cpu_beyond_floor_percent"] = round(result["idle_cpu_percent"] - floor, 2)
    finally:
        sqs.stop()
    return result


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pg-url", default="postgresql://postgres@127.0.0.1:5432/postgres", help="PostgreSQL"
    )
    parser.add_argument(
        "--daemon-path",
        type=Path,
        help="run the daemon of this checkout (its PYTHONPATH), e.g. a worktree of the last "
        "landed version, to compare with",
    )


BENCH = Bench(
    module="tests.benchmarks.bench_scale",
    description="the daemon with 10,000 pipelines beside 1,000: idle CPU, reload, list, latency",
    parts={
        "sqlite_10k": lambda args, workdir: part_scale(args, workdir, "sqlite", args.pipelines),
        "sqlite_1k": lambda args, workdir: part_scale(args, workdir, "sqlite", args.few),
        "postgresql_10k": lambda args, workdir: part_scale(
            args, workdir, "postgresql", args.pipelines
        ),
        "postgresql_1k": lambda args, workdir: part_scale(args, workdir, "postgresql", args.few),
    },
    full={
        "pipelines": 10_000,
        "few": 1_000,
        "idle_seconds": 60.0,
        "messages": 20,
        "message_gap_s": 1.0,
    },
    quick={
        "pipelines": 1_000,
        "few": 200,
        "idle_seconds": 10.0,
        "messages": 5,
        "message_gap_s": 0.5,
    },
    goals=GOALS,
    options=_options,
)

if __name__ == "__main__":
    main(BENCH)
