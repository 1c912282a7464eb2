"""The REST API: an event POSTed to a run created, and events/s with concurrent clients.

    python -m tests.benchmarks.bench_api --out bench_api.json [--quick]

Runs the daemon in this process with ``serve()`` and its API on a free loopback port, on SQLite
and on a fresh PostgreSQL database. The pipelines: ``on_order`` (per event, on ``orders``) and
``pile`` (on ``[piled, never]``, so its events only queue). The launcher's one run slot
(``[runs] parallelism = 1``) is held by ``hold``, a manual run that sleeps, so no run process adds
CPU noise: runs are created and stay queued.

- latency: POST /assets/events on ``orders``, one at a time; from sending the POST to the
  ``created_at`` of the run that consumed the event (the polling client waits for it every
  10 ms). Goal: p50 <= 20 ms on SQLite.
- throughput: 8 clients in a process of their own (``post_load``, aiohttp) POST events on
  ``piled`` as fast as they can; events/s, against two baselines run alongside: 8 tasks calling
  ``record_events`` one event per transaction (what a route without group commit could do at
  best), and the HTTP ceiling: the same clients against a FastAPI route that only validates the
  body (what any route of this server could do at best). Goal: >= 1,000 events/s on SQLite and
  >= 2,000 on PostgreSQL.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import httpx
import uvicorn
from fastapi import FastAPI

from deploy.local.services import free_port
from tests.benchmarks.harness import DEFAULT_PG_URL, database
from tests.benchmarks.report import publish
from triggerer.service.api.schemas import NewAssetEvent  # noqa: TC001  # FastAPI reads it at runtime
from triggerer.service.api.server import api_server
from triggerer.service.config import LoggingSettings, Settings
from triggerer.service.daemon.service import serve
from triggerer.service.events import NewEvent, record_events
from triggerer.service.logs import configure_logging
from triggerer.service.store import create_engine, models, session_factory, upgrade

PIPELINES = """
import time

from triggerer import Asset, pipeline

orders, piled, never = Asset("orders"), Asset("piled"), Asset("never")


@pipeline(schedule=orders, run_policy="per_event", max_active_runs=100_000)
def on_order(spark, context):
    pass


@pipeline(schedule=[piled, never])
def pile(spark, context):
    pass


@pipeline(schedule=None)
def hold(spark, context):
    time.sleep(3600)
"""
CLIENTS = 8
FULL = {"latency_events": 300, "throughput_events": 4000}
QUICK = {"latency_events": 50, "throughput_events": 800}


def settings(workdir: Path, database_url: str, port: int) -> Settings:
    return Settings.model_validate(
        {
            "database": {"url": database_url},
            "pipelines": {"dir": workdir / "pipelines"},
            "spark": {
                "mode": "connect",
                "remote": "sc://127.0.0.1:1",
                "logs_dir": workdir / "logs",
            },
            "runs": {"parallelism": 1},
            "api": {"port": port},
            "logging": {"level": "WARNING"},
        }
    )


async def latency(client: httpx.AsyncClient, count: int) -> dict[str, Any]:
    samples_ms = []
    for index in range(count):
        started = dt.datetime.now(dt.UTC)
        posted = await client.post("/assets/events", json={"uri": "orders", "extra": {"i": index}})
        posted.raise_for_status()
        event_id = posted.json()["id"]
        # Polling is what a client can do (no event tells it a run was created); the run's own
        # creation time is the measure, so the polling interval adds nothing to it.
        while not (consumed := (await client.get(f"/events/{event_id}")).json()["consumed_by"]):  # noqa: ASYNC110
            await anyio.sleep(0.01)
        run = (await client.get(f"/runs/{consumed[0]['run_id']}")).json()
        created = dt.datetime.fromisoformat(run["created_at"])
        samples_ms.append((created - started).total_seconds() * 1000)
    samples_ms = samples_ms[3:]  # warm-up
    quantiles = statistics.quantiles(samples_ms, n=100)
    return {
        "events": len(samples_ms),
        "p50_ms": round(quantiles[49], 1),
        "p99_ms": round(quantiles[98], 1),
    }


async def api_throughput(base_url: str, count: int) -> float:
    """Events/s of CLIENTS clients in a process of their own (``post_load``)."""
    loaded = await anyio.run_process(
        [
            sys.executable,
            "-m",
            "tests.benchmarks.post_load",
            base_url,
            "piled",
            str(count),
            str(CLIENTS),
        ]
    )
    rate: float = json.loads(loaded.stdout)["events_per_s"]
    return rate


async def raw_throughput(database_url: str, workdir: Path, count: int) -> float:
    """``record_events`` of one event per transaction from 8 tasks, on a migrated database
    with the same pipelines synced."""
    from triggerer.service.loader import load_pipelines
    from triggerer.service.scheduling.registry import sync_definitions

    await upgrade(database_url)
    engine = create_engine(database_url)
    sessions = session_factory(engine)
    try:
        async with sessions.begin() as session:
            registry = await sync_definitions(session, load_pipelines(workdir / "pipelines"))
        piled = next(i for i, asset in registry.assets.items() if asset.name == "piled")
        per_task = count // CLIENTS

        async def record_many(offset: int) -> None:
            for index in range(per_task):
                async with sessions.begin() as session:
                    new = NewEvent(piled, {"i": offset + index}, models.EventSource.REST_API)
                    await record_events(session, [new])

        started = time.perf_counter()
        async with anyio.create_task_group() as tasks:
            for number in range(CLIENTS):
                tasks.start_soon(record_many, number * per_task)
        return per_task * CLIENTS / (time.perf_counter() - started)
    finally:
        await engine.dispose()


async def http_ceiling(count: int) -> float:
    """Events/s the same clients get from a route that only validates the body and answers
    201, served by uvicorn in this process as the daemon serves its API: the most FastAPI
    gives on this machine, with no store, auth or scheduler behind it."""
    app = FastAPI()

    @app.post("/api/v1/assets/events", status_code=201)
    async def create(new: NewAssetEvent) -> dict[str, int]:
        return {"id": 1}

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off", log_config=None)
    )
    async with anyio.create_task_group() as group:
        group.start_soon(server.serve)
        while not server.started:  # noqa: ASYNC110  # uvicorn offers no event for it
            await anyio.sleep(0.01)
        rate = await api_throughput(f"http://127.0.0.1:{port}/api/v1", count)
        server.should_exit = True
    return rate


async def measure(backend: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    folder = workdir / backend
    (folder / "pipelines").mkdir(parents=True)
    (folder / "pipelines" / "bench.py").write_text(PIPELINES)
    result: dict[str, Any] = {}
    with database(backend, folder, args.pg_url, "daemon") as database_url:
        port = free_port()
        stop = anyio.Event()
        async with anyio.create_task_group() as group:
            await group.start(
                partial(
                    serve,
                    settings(folder, database_url, port),
                    api=api_server,
                    shutdown_trigger=stop.wait,
                )
            )
            base = f"http://127.0.0.1:{port}/api/v1"
            limits = httpx.Limits(max_connections=CLIENTS)
            async with httpx.AsyncClient(base_url=base, limits=limits) as client:
                (await client.post("/pipelines/hold/runs", json={})).raise_for_status()
                result["latency"] = await latency(client, args.latency_events)
            result["api_events_per_s"] = round(await api_throughput(base, args.throughput_events))
            stop.set()
    with database(backend, folder, args.pg_url, "raw") as database_url:
        result["raw_record_events_per_s"] = round(
            await raw_throughput(database_url, folder, args.throughput_events)
        )
    result["api_vs_raw"] = round(result["api_events_per_s"] / result["raw_record_events_per_s"], 2)
    result["http_ceiling_events_per_s"] = round(await http_ceiling(args.throughput_events))
    result["api_vs_http_ceiling"] = round(
        result["api_events_per_s"] / result["http_ceiling_events_per_s"], 2
    )
    return result


async def run_all(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"meta": {"cores": os.cpu_count(), "clients": CLIENTS}}
    with tempfile.TemporaryDirectory(prefix="bench-api-") as workdir:
        for backend in ("sqlite", "postgresql"):
            results[backend] = await measure(backend, args, Path(workdir))
    results["meta"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench_api.json"))
    parser.add_argument("--quick", action="store_true", help="small sizes: " + json.dumps(QUICK))
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL, help="server to create databases on")
    args = parser.parse_args(argv)
    for name, size in (QUICK if args.quick else FULL).items():
        setattr(args, name, size)
    configure_logging(LoggingSettings(level="WARNING", format="console"))
    results = anyio.run(run_all, args)
    publish(results, args.out)


if __name__ == "__main__":
    main()
